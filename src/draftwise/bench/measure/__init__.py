"""The experiments behind the figures the docs and README publish, one module each, run through
`draftwise measure NAME` (cli/measure.py): each returns a frozen result that `experiments.record`
writes as results.json beside the host it ran on (bench.record), so a published figure is one
command away and the test suite runs every experiment at tiny size.

`experiments.EXPERIMENTS` names them and the pages that cite their figures.
"""
