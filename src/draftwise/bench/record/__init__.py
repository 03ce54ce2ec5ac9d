"""What every measurement shares: the host it ran on and the clock and memory probes (timing),
the progress bar on stderr (progress), and the results file, saved atomically and resumable
(results).

The bench runs (bench.sweep), the load and side-by-side benchmarks and the experiments behind the
published figures (bench.measure) all record through these, so a figure from any of them names
its host and its clock the same way.
"""
