"""draftwise measure openmp-teams at tiny size: both arrangements run in processes of their own and
the result is their medians (the figure itself is the host's: docs/bench/serve-peers)."""

from __future__ import annotations

import pytest

from draftwise.bench.measure import openmp_teams


def test_both_arrangements_are_timed_in_fresh_processes(tiny_gguf_dir):
    ticks = []
    result = openmp_teams.measure(
        str(tiny_gguf_dir / "target.gguf"), threads=2, rounds=2, forwards=3, on_run=ticks.append
    )
    assert ticks == ["one team", "two teams"] * 2
    assert len(result.one_team_ms) == len(result.two_teams_ms) == 2
    assert all(ms > 0 for ms in (*result.one_team_ms, *result.two_teams_ms))
    # (the medians are rounded to 0.01 ms: a tiny model's forwards take about 1 ms)
    assert result.slowdown == pytest.approx(result.two_teams_median_ms / result.one_team_median_ms, rel=0.02)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        openmp_teams.measure("x.gguf", rounds=0)
