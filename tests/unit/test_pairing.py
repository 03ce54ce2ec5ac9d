"""Draft pairing (`--draft auto`, draftwise.pairing): a fake home whose folder of models holds
tiny GGUFs of two vocabularies and several sizes; the draft the auto policy would gain most from
is picked (the target's own vocabulary first, another only where none of those pays), priced from
the target's cost curve (scaled by size, or the draft's own cached curve), and none where none
can pay, each with its one-line note, through the library and the CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from draftwise import calibrate, loading, pairing, stores
from draftwise.backends.base import Capabilities
from draftwise.calibrate import CostCurve
from draftwise.cli import main
from draftwise.loading import Calibration, LoadOptions, load
from draftwise.types import SpeculationConfig
from tiny_gguf import write_tiny_gguf

# A target whose forward of n tokens costs 30 + 2 (n - 1) ms: verification is cheap beside a token.
TARGET_CURVE = CostCurve.linear(30.0, 2.0, max_n=64)
OTHER = ("<|im_start|>", "<|im_end|>")  # tokens that make another vocabulary of the same texts
STORE_VARIABLES = ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "LLAMA_CACHE")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home with no store but a folder of models (--models-dir): the target (n_embd 256, 4
    layers), a draft of its vocabulary (n_embd 64), one of another vocabulary (n_embd 32), and
    one larger than the target."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    for name in STORE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    folder = tmp_path / "models"
    folder.mkdir()
    write_tiny_gguf(folder / "target.gguf", n_embd=256, n_layers=4, n_ff=512)
    write_tiny_gguf(folder / "same-small.gguf", seed=1, n_embd=64)
    write_tiny_gguf(folder / "other-tiny.gguf", seed=2, n_embd=32, n_head=2, n_head_kv=1, special_tokens=OTHER)
    write_tiny_gguf(folder / "same-large.gguf", seed=3, n_embd=512, n_layers=4, n_ff=1024)
    return folder


def _pair(folder, curve=TARGET_CURVE, available=2**40):
    discovery = stores.discover(stores.StoreRoots.from_environment([folder]))
    return pairing.pair_draft(
        folder / "target.gguf", curve, threads=1, n_ctx=256, discovery=discovery, available=available
    )


def test_the_same_vocabulary_is_preferred_when_it_pays(home):
    paired = _pair(home)
    assert paired.draft is not None and paired.draft.name == "same-small.gguf"
    assert paired.draft.same_vocabulary and not paired.draft.calibrated
    assert paired.note.startswith("draft: same-small.gguf (same vocabulary, ")
    assert "of the target's size; at 0.70 acceptance" in paired.note and "x on this host" in paired.note
    names = [c.name for c in paired.priced]
    assert "same-large.gguf" not in names and "target.gguf" not in names  # larger, and the target itself
    assert all(c.same_vocabulary for c in paired.priced)  # another vocabulary is not even read


def test_another_vocabulary_where_the_same_cannot_pay(home):
    # the same-vocabulary draft's own curve: as slow as the target per token, so it never pays
    small = home / "same-small.gguf"
    stat = small.stat()
    identity = f"{small.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    bare = {"identity": identity, "n_threads": 1, "n_ctx": 256, "capabilities": Capabilities()}
    cached = calibrate.cache_file(type("B", (), bare)())
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(CostCurve.linear(30.0, 2.0, max_n=8).to_dict()))
    paired = _pair(home)
    assert paired.draft is not None and paired.draft.name == "other-tiny.gguf"
    assert "another vocabulary" in paired.note
    same = next(c for c in paired.priced if c.name == "same-small.gguf")
    assert same.calibrated and same.speedup < 1.1


def test_none_is_paired_where_none_can_pay(home):
    # a target whose verification costs as much per token as a forward: no draft pays
    flat = CostCurve.linear(30.0, 30.0, max_n=64)
    paired = _pair(home, flat)
    assert paired.draft is None
    assert paired.note.startswith("not loaded: no model of yours would pay as a draft on this host: the best, ")
    assert "below the 1.10x the auto policy needs" in paired.note
    too_small = _pair(home, available=1)  # nothing fits in the memory left
    assert too_small.draft is None and "smaller than the target and fits in the memory left" in too_small.note


def _calibrated(target, drafts=(), progress=None):
    """Curves as a host where the small draft pays (no timing in a test)."""
    return Calibration({"target": TARGET_CURVE, **{name: CostCurve.linear(3.0, 0.5) for name in drafts}})


def test_load_pairs_the_draft_and_says_so(home, monkeypatch):
    monkeypatch.setattr(loading, "calibrate_models", _calibrated)
    options = LoadOptions(n_ctx=256, threads=1, models_dirs=(str(home),))
    loaded = load(str(home / "target.gguf"), "ngram,auto", options=options)
    try:
        engine = loaded.engine
        assert [d.name for d in engine.drafters][:2] == ["ngram", "draft"] and not engine.skipped_drafters
        assert loaded.draft_note.startswith("draft: same-small.gguf (same vocabulary")
    finally:
        engine.target.close()
    monkeypatch.setattr(loading, "calibrate_models", lambda t, d=(), p=None: Calibration({"target": TARGET_CURVE}))
    monkeypatch.setattr(pairing, "MIN_GAIN", 100.0)  # nothing pays
    loaded = load(str(home / "target.gguf"), "auto", options=options, speculation=SpeculationConfig(policy="fixed"))
    try:
        assert loaded.engine.drafters == [] and loaded.draft_note == ""
        assert loaded.engine.skipped_drafters["draft"].startswith("not loaded: no model of yours would pay")
    finally:
        loaded.engine.target.close()


def test_the_cli_says_which_draft_in_one_line(home, monkeypatch):
    monkeypatch.setattr(loading, "calibrate_models", _calibrated)
    args = ["generate", "--target", str(home / "target.gguf"), "--prompt", "hi", "--max-tokens", "2"]
    args += ["--draft", "auto", "--models-dir", str(home), "--n-ctx", "256", "--threads", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: draft: ")]
    assert len(notes) == 1 and "same-small.gguf (same vocabulary" in notes[0]


def test_draftwise_models_lists_each_models_compatible_drafts(home):
    """The drafts column: smaller models of the same vocabulary first, then another vocabulary's
    (cross-vocabulary drafting); none for the smallest."""
    found = stores.discover(stores.StoreRoots.from_environment([home])).models
    drafts = pairing.compatible_drafts(found)
    assert drafts["target.gguf"] == [
        pairing.Compatible("same-small.gguf", True),
        pairing.Compatible("other-tiny.gguf", False),
    ]
    assert [d.name for d in drafts["same-large.gguf"]][:2] == ["same-small.gguf", "target.gguf"]
    assert drafts["other-tiny.gguf"] == []
    result = CliRunner().invoke(main, ["models", "--json", "--models-dir", str(home)])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)["models"]}
    assert rows["target.gguf"]["drafts"][0] == {"name": "same-small.gguf", "same_vocabulary": True}


def test_the_cli_passes_the_cross_vocabulary_draft_level_and_prompt(home, monkeypatch):
    monkeypatch.setattr(loading, "calibrate_models", _calibrated)
    made = []
    real = loading.model_drafter

    def recording(target, draft, vocab, options):
        drafter = real(target, draft, vocab, options)
        made.append(drafter)
        return drafter

    monkeypatch.setattr(loading, "model_drafter", recording)
    args = ["generate", "--target", str(home / "target.gguf"), "--prompt", "hi", "--max-tokens", "2"]
    args += ["--draft", str(home / "other-tiny.gguf"), "--policy", "fixed", "--n-ctx", "256", "--threads", "1"]
    result = CliRunner().invoke(main, [*args, "--draft-level", "token", "--draft-prompt", "plain"])
    assert result.exit_code == 0, result.output
    assert [(d.draft_level, d.prompt_mode) for d in made] == [("token", "plain")]
    result = CliRunner().invoke(main, [*args, "--draft-level", "word"])
    assert result.exit_code == 2 and "'word' is not one of 'auto', 'string', 'token'" in result.output
