"""Command line: draftwise models | pull | generate | chat | complete | demo | calibrate | bench |
bench-serve | replay | corpus | measure | serve | index.

A thin client of the public API, one module per command group: generate.py (generate, demo),
chat.py (a conversation in the terminal, tokens coloured by source), complete.py (fill in the
middle at a cursor), serve.py (serve, also on Ray), bench.py (bench, bench-serve), replay.py,
corpus.py (a development corpus from local source files), measure.py (the experiments behind
published figures), models.py (models, pull, calibrate, index);
common.py holds what they share. Bad arguments end with a one-line message and a non-zero exit
status, never a traceback.
"""

from __future__ import annotations

import click

from draftwise.cli import bench, bench_serve, chat, complete, corpus, generate, measure, models, replay, serve

__all__ = ["main"]


@click.group()
@click.version_option(package_name="draftwise")
def main() -> None:
    """draftwise: lossless speculative decoding for local LLMs."""


for command in (
    models.list_models,
    models.pull,
    generate.generate,
    chat.chat,
    complete.complete,
    generate.demo,
    serve.serve,
    bench.bench,
    bench_serve.bench_serve,
    models.calibrate,
    models.index,
    replay.replay,
    corpus.corpus,
    measure.measure,
):
    main.add_command(command)
