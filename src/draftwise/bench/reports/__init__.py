"""The bench's reports: results.json to report.md (report; its header, report_header; the sections after
the per-setting tables, report_sections), to one self-contained page (report_html with the
report.html.j2 template) and to PNG plots (plots); how records group and aggregate (grouping); and
the long-context part, speed and memory by context length (long_context). The load and
side-by-side benchmarks write reports of their own beside their runs (bench.serving,
bench.side_by_side)."""
