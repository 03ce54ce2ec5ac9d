"""Calibration is never inside a timed figure: it happens at load (loading.load), before any
request, and is reported apart (calibration_ms); a lazy one (an engine built by hand) stays out
of decode_ms. The measurement is made slow on purpose (SLOW_S per measured grid), so a figure
that counted it would be far above one that did not, on however noisy a host."""

import json

import pytest
from click.testing import CliRunner

from draftwise import calibrate
from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.bench.sweep.engine_setup import calibration_meta, load_bench_engine
from draftwise.cli import main
from draftwise.drafters import NgramDrafter
from draftwise.engine import Engine
from draftwise.loading import LoadOptions, calibrate_models, load
from draftwise.types import SamplingParams, SpeculationConfig

SLOW_S = 1.0
SLOW_MS = 1000 * SLOW_S
PROMPT = "def f(x):\n    return x\n\ndef f(x):\n"


@pytest.fixture
def slow_calibration(tmp_path, monkeypatch):
    """An empty calibration cache, a measurement that takes SLOW_S longer, and no stale check (a
    cached curve always serves: whether it is stale is test_policy's concern)."""
    import time

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    measure_grid = calibrate.measure_grid
    grids = []

    def slow(backend, points=calibrate.QUICK_POINTS, **kwargs):
        grids.append(backend.name)
        time.sleep(SLOW_S)
        return measure_grid(backend, points, **kwargs)

    monkeypatch.setattr(calibrate, "measure_grid", slow)
    monkeypatch.setattr(calibrate, "stale", lambda backend, curve: False)
    return grids


@pytest.fixture
def tiny(tiny_gguf_dir):
    return str(tiny_gguf_dir / "target.gguf")


def test_calibrate_models_reports_what_it_measured_and_how_long(slow_calibration):
    target = ToyBackend(ToyModel(vocab_size=8, seed=1), name="t")
    draft = ToyBackend(ToyModel(vocab_size=8, seed=2), name="d")
    told = []
    first = calibrate_models(target, {"draft": draft}, lambda model, done, total: told.append((model, done, total)))
    assert first.measured == ("target", "draft") and first.ms >= 2 * SLOW_MS
    assert set(first.curves) == {"target", "draft"}
    # Each model's bar starts at 0 and ends at its total.
    for model in ("target", "draft"):
        rounds = [(done, total) for m, done, total in told if m == model]
        assert rounds[0][0] == 0 and rounds[-1][0] == rounds[-1][1] > 0
    again = calibrate_models(target, {"draft": draft}, lambda *a: told.append(a))
    assert again.measured == () and again.ms == 0.0 and again.curves == first.curves
    assert slow_calibration == ["t", "d"]


def test_a_lazy_calibration_stays_out_of_decode_time(slow_calibration):
    """An engine made by hand calibrates on its first auto request; with the prompt cached (no
    prefill to restart the clock) that still is not decoding."""
    engine = Engine(ToyBackend(ToyModel(vocab_size=16, seed=3), name="lazy"), [NgramDrafter()])
    sampling = SamplingParams(max_tokens=12, ignore_eos=True)
    engine.generate(PROMPT, sampling=sampling, speculation=SpeculationConfig(policy="fixed"))
    auto = engine.generate(PROMPT, sampling=sampling, speculation=SpeculationConfig(policy="auto"))
    assert slow_calibration == ["lazy"]  # it did calibrate, in that request
    assert auto.stats.num_generated == 12 and auto.stats.decode_ms < SLOW_MS / 2


def test_load_calibrates_before_the_first_request(slow_calibration, tiny):
    options = LoadOptions(threads=1, n_ctx=512)
    sampling = SamplingParams(max_tokens=16, ignore_eos=True)
    decode_ms = []
    for _ in range(2):
        loaded = load(tiny, "ngram", options=options, speculation=SpeculationConfig(policy="auto"))
        grids = len(slow_calibration)
        result = loaded.engine.generate(PROMPT, sampling=sampling)
        assert len(slow_calibration) == grids  # nothing measured inside the request
        decode_ms.append(result.stats.decode_ms)
        if len(decode_ms) == 1:
            assert loaded.calibration.measured == ("target",) and loaded.calibration.ms >= SLOW_MS
        else:
            assert loaded.calibration.measured == () and loaded.calibration.ms == 0.0
        loaded.engine.target.close()
    assert max(decode_ms) < SLOW_MS / 2  # the first run's decode time is a cached run's, not + SLOW_S


def test_a_fixed_policy_load_measures_nothing_unless_asked(slow_calibration, tiny):
    options = LoadOptions(threads=1, n_ctx=512)
    fixed = load(tiny, "ngram", options=options, speculation=SpeculationConfig(policy="fixed"))
    assert fixed.calibration.measured == () and slow_calibration == []
    fixed.engine.target.close()
    asked = load(tiny, "ngram", options=options, speculation=SpeculationConfig(policy="fixed"), calibrate=True)
    assert asked.calibration.measured == ("target",)
    asked.engine.target.close()


def generate_json(tiny):
    args = ["generate", "--prompt", PROMPT, "--target", tiny, "--threads", "1", "--n-ctx", "512"]
    result = CliRunner().invoke(main, [*args, "--draft", "ngram", "--max-tokens", "16", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def test_generate_json_reports_calibration_apart(slow_calibration, tiny):
    first, cached = generate_json(tiny), generate_json(tiny)
    assert first["calibration_ms"] >= SLOW_MS and cached["calibration_ms"] == 0.0
    assert first["decode_ms"] < SLOW_MS / 2 and cached["decode_ms"] < SLOW_MS / 2


def test_demo_says_once_that_it_calibrated(slow_calibration, tiny, tiny_gguf_dir):
    args = ["demo", "--target", tiny, "--draft-model", str(tiny_gguf_dir / "twin.gguf"), "--threads", "1"]
    args += ["--n-ctx", "1024", "--max-tokens", "12"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert first.output.count("note: calibrated the target, the draft model in") == 1
    # Two tables by default: new code, and an edit where the lookups pay; each run in both.
    said = " ".join(first.output.split())  # the narrow test console wraps titles
    assert "new code, greedy" in said and "an edit of code in the prompt, greedy" in said
    assert said.count("ngram k=8") == 4  # each table's row, and its progress line
    grids = len(slow_calibration)
    cached = CliRunner().invoke(main, args)
    assert cached.exit_code == 0, cached.output
    assert "note: calibrated" not in cached.output and len(slow_calibration) == grids
    own = CliRunner().invoke(main, [*args, "--prompt", "Say hi."])
    assert own.exit_code == 0, own.output
    said = " ".join(own.output.split())
    assert "your prompt, greedy" in said and "new code" not in said and said.count("ngram k=8") == 2


def test_bench_loading_reports_calibration_ms(slow_calibration, tiny):
    options = LoadOptions(threads=1, n_ctx=512)
    first = load_bench_engine(tiny, None, need_draft=False, options=options, calibrate=True)
    meta = calibration_meta(first.calibration)
    assert meta["calibration_ms"] >= SLOW_MS and "rss_target_mb" in first.memory
    assert meta["calibration"]["target"]["1"] > 0 and meta["calibration_context"]["target"]["context_len"] > 0
    first.engine.target.close()
    again = load_bench_engine(tiny, None, need_draft=False, options=options, calibrate=True)
    cached = calibration_meta(again.calibration)
    assert cached["calibration_ms"] == 0.0 and cached["calibration"] == meta["calibration"]
    again.engine.target.close()
