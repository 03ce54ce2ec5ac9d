"""Replay of recorded answers through the auto policy (draftwise replay)."""

import json

import pytest
from click.testing import CliRunner

from draftwise.backends.toy import CharTokenizer
from draftwise.bench.offline.replay import ReplayRun, baseline_answers, calibrated_curve, replay, summarize
from draftwise.bench.suites.prompts import Prompt
from draftwise.calibrate import CostCurve
from draftwise.cli import main
from draftwise.drafters import NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.types import ConfigError

CODE = "def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
PROMPTS = [
    Prompt(1, "code_edit", ("Add nothing, repeat this code:\n" + CODE,)),
    Prompt(2, "chat", ("Say hi.", "Again?")),
]
ANSWERS = {(1, 0): CODE, (2, 0): "hi there", (2, 1): "hi there again"}
# Verification is cheap per extra token here, so copying pays.
CURVE = CostCurve(((1, 30.0), (2, 33.0), (32, 120.0)))


def sets():
    return {"ngram": [NgramDrafter()], "suffix": [SuffixDrafter()], "none": []}


def test_copying_answer_replays_faster_and_is_deterministic():
    tok = CharTokenizer(96)
    runs = replay(PROMPTS, ANSWERS, tok, sets(), CURVE, count_lookups=False)
    again = replay(PROMPTS, ANSWERS, tok, sets(), CURVE, count_lookups=False)
    assert runs == again
    by = {(r.question_id, r.turn, r.drafters): r for r in runs}
    copy = by[(1, 0, "ngram")]
    assert copy.num_tokens == len(CODE) and copy.num_steps < copy.num_tokens / 2 and copy.speedup > 1.5
    assert by[(1, 0, "none")].num_steps == len(CODE) and by[(1, 0, "none")].speedup == pytest.approx(1.0)
    assert {(r.question_id, r.turn) for r in runs} == {(1, 0), (2, 0), (2, 1)}  # every turn, in order
    summary = summarize(runs)
    assert summary["code_edit"]["ngram"]["tokens_per_step"] > 2
    assert summary["all"]["none"]["speedup"] == pytest.approx(1.0)
    assert summary["all"]["ngram"]["turns"] == 3


def test_the_oracle_bounds_the_policy_and_knows_a_full_copy():
    tok = CharTokenizer(96)
    runs = replay(PROMPTS, ANSWERS, tok, sets(), CURVE, count_lookups=False, oracle=True)
    for r in runs:
        assert r.oracle_ms <= r.ms + 1e-9 and r.oracle_speedup >= r.speedup
    by = {(r.question_id, r.turn, r.drafters): r for r in runs}
    assert by[(1, 0, "none")].oracle_ms == pytest.approx(len(CODE) * CURVE.ms(1))  # nothing to draft with
    # The answer repeats the prompt's code: the hindsight optimum copies nearly all of it.
    assert by[(1, 0, "ngram")].oracle_speedup > by[(1, 0, "ngram")].speedup > 1.5
    assert "oracle_speedup" in summarize(runs)["all"]["ngram"]


def test_an_answer_that_ended_at_once_is_left_out_and_the_next_turn_goes_on():
    # A FIM answer whose first token was EOS has no text: nothing to draft, no speedup to divide.
    tok = CharTokenizer(96)
    answers = {**ANSWERS, (2, 0): ""}
    runs = replay(PROMPTS, answers, tok, sets(), CURVE, count_lookups=False, oracle=True)
    assert {(r.question_id, r.turn) for r in runs} == {(1, 0), (2, 1)}
    assert summarize(runs)["chat"]["ngram"]["turns"] == 1


def test_the_oracle_takes_the_cheapest_schedule():
    from draftwise.bench.offline.replay import oracle_ms
    from draftwise.types import SpeculationConfig

    answer = list(range(10, 30))  # a 20-token answer the drafter knows in full
    prompt = [*answer, 1]  # the prompt holds it; the answer's first tokens are then a 1-token match away
    curve = CostCurve(((1, 10.0), (20, 40.0)))
    best = oracle_ms([NgramDrafter(1, 4)], SpeculationConfig(), prompt, answer, curve, max_k=64)
    # Step 1 has no match (context ends in 1): one plain step, then the other 19 in one forward.
    assert best == pytest.approx(10.0 + curve.ms(19))
    capped = oracle_ms([NgramDrafter(1, 4)], SpeculationConfig(), prompt, answer, curve, max_k=4)
    assert capped > best  # drafts of at most 4 need more forwards


def test_the_cheapest_schedule_drafts_what_is_right_where_it_pays():
    from draftwise.bench.offline.replay import cheapest_schedule

    curve = CostCurve(((1, 10.0), (2, 15.0), (3, 40.0)))  # 2 tokens cost less than two plain steps, 3 more than 3
    best, choice = cheapest_schedule([1, 0], 0, curve)
    assert choice == [1, 0] and best[0] == pytest.approx(15.0)
    best, choice = cheapest_schedule([2, 0, 0], 0, curve)
    assert choice == [1, 0, 0] and best[0] == pytest.approx(25.0)  # 1 drafted, then a plain step


def test_noise_is_seeded():
    tok = CharTokenizer(96)
    a = replay(PROMPTS, ANSWERS, tok, sets(), CURVE, count_lookups=False, noise=0.2, seed=1)
    b = replay(PROMPTS, ANSWERS, tok, sets(), CURVE, count_lookups=False, noise=0.2, seed=1)
    c = replay(PROMPTS, ANSWERS, tok, sets(), CURVE, count_lookups=False, noise=0.2, seed=2)
    assert a == b and a != c


def test_speedup_is_plain_time_over_replayed_time():
    assert ReplayRun("c", 1, 0, "x", 10, 5, 150.0, 300.0).speedup == 2.0


def test_results_without_baseline_or_calibration_are_refused():
    with pytest.raises(ConfigError, match="baseline"):
        baseline_answers({"records": [{"method": "auto", "question_id": 1, "turn": 0, "text": "x"}]})
    with pytest.raises(ConfigError, match="cost curve"):
        calibrated_curve({"meta": {}})


def test_the_curve_of_a_results_file_keeps_its_growth_with_context():
    meta = {
        "calibration": {"target": {"1": 30.0, "8": 90.0}},
        "calibration_context": {"target": {"context_len": 256, "growth": [4.0, 2.0]}},
    }
    curve = calibrated_curve({"meta": meta})
    assert curve.ms(1) == 30.0 and curve.ms(8, 1256) == pytest.approx(90.0 + 4.0 + 16.0)
    assert curve.ms(1, 1256) == pytest.approx(36.0)  # no growth_one: one row on the same line
    assert calibrated_curve({"meta": {"calibration": meta["calibration"]}}).growth == (0.0, 0.0)  # older results
    meta["calibration_context"]["target"]["growth_one"] = 5.0  # one row's own growth (cache version 3)
    assert calibrated_curve({"meta": meta}).ms(1, 1256) == pytest.approx(35.0)


def _results(tmp_path, target):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p.to_dict()) + "\n" for p in PROMPTS))
    records = [
        {
            "method": "baseline",
            "question_id": q,
            "turn": t,
            "text": text,
            "temperature": 0.0,
            "context_tokens": None,
            "error": None,
        }
        for (q, t), text in ANSWERS.items()
    ]
    results = {
        "format": "draftwise-bench/1",
        "records": records,
        "meta": {
            "target": target,
            "prompts": str(prompts),
            "backend": "auto",
            "calibration": {"target": {"1": 30.0, "2": 33.0, "32": 120.0}},
        },
    }
    (tmp_path / "results.json").write_text(json.dumps(results))
    return tmp_path


def test_cli_replay_prints_a_table_and_json(tiny_gguf_dir, tmp_path):
    out = _results(tmp_path, str(tiny_gguf_dir / "target.gguf"))
    result = CliRunner().invoke(
        main, ["replay", str(out), "--drafters", "ngram,ngram+suffix", "--free-lookups", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert set(summary) == {"code_edit", "chat", "all"} and set(summary["all"]) == {"ngram", "ngram+suffix"}
    table = CliRunner().invoke(main, ["replay", str(out / "results.json"), "--categories", "code_edit"])
    assert table.exit_code == 0 and "code_edit" in table.output and "chat" not in table.output
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps(CostCurve(((1, 30.0), (64, 200.0))).to_dict()))  # a calibration file's form
    oracle = CliRunner().invoke(
        main,
        [
            "replay",
            str(out),
            "--drafters",
            "ngram",
            "--free-lookups",
            "--oracle",
            "--max-k",
            "8",
            "--curve",
            str(curve),
            "--json",
        ],
    )
    assert oracle.exit_code == 0, oracle.output
    got = json.loads(oracle.output)["all"]["ngram"]
    assert got["oracle_speedup"] >= got["speedup"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--drafters", "draft"], "free drafters"),
        (["--drafters", "datastore"], "--datastore"),
    ],
)
def test_cli_replay_bad_arguments(tiny_gguf_dir, tmp_path, args, message):
    out = _results(tmp_path, str(tiny_gguf_dir / "target.gguf"))
    result = CliRunner().invoke(main, ["replay", str(out), *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_places_in_the_copies():
    from draftwise.bench.offline.replay import Positions, places

    def at(correct):
        n = len(correct)
        return places(Positions(tuple(correct), ("x",) * n, (False,) * n))

    assert at([0, 3, 2, 1, 0]) == ["none", "start", "early", "early", "none"]
    # A 20-token copy, one token no drafter gets right (an edit), then the copy resumes.
    copy = list(range(20, 0, -1))
    where = at([*copy, 0, 5, 4, 3, 2, 1])
    assert where[:17] == ["start", *["early"] * 15, "deep"] and where[20:22] == ["none", "resume"]
    # A short copy before the edit makes the next one a plain start.
    assert at([3, 2, 1, 0, 4, 3, 2, 1])[4] == "start"


def test_gaps_say_where_the_oracle_gains():
    from draftwise.bench.offline.replay import gaps

    tok = CharTokenizer(96)
    runs = replay(PROMPTS, ANSWERS, tok, {"ngram": [NgramDrafter()]}, CURVE, count_lookups=False, detail=True)
    copy = next(r for r in runs if r.question_id == 1)
    # Both schedules cover the answer exactly, and their times are the run's.
    for steps in (copy.steps, copy.oracle_steps):
        assert steps[0].pos == 0 and sum(s.accepted + 1 for s in steps) == copy.num_tokens
        assert all(a.pos + a.accepted + 1 == b.pos for a, b in zip(steps, steps[1:]))
    assert sum(s.ms for s in copy.steps) == pytest.approx(copy.ms)
    assert sum(s.ms for s in copy.oracle_steps) == pytest.approx(copy.oracle_ms)
    found = gaps(runs)
    assert sum(g.tokens for g in found.values()) == sum(r.num_tokens for r in runs)
    assert sum(g.policy_ms for g in found.values()) == pytest.approx(sum(r.ms for r in runs))
    assert sum(g.oracle_ms for g in found.values()) == pytest.approx(sum(r.oracle_ms for r in runs))
    assert sum(g.policy_steps for g in found.values()) == sum(r.num_steps for r in runs)
    assert {place for place, _ in found} <= {"none", "start", "resume", "early", "deep"}
    lines = gaps(runs, by_line_start=True)
    assert any(place.endswith("@line") for place, _ in lines)  # the code's lines start after "\n"


def test_reference_answers_of_a_prompt_file():
    from draftwise.bench.offline.replay import reference_answers

    prompts = [Prompt(1, "edit", ("Repeat:\n" + CODE,), reference=CODE), Prompt(2, "chat", ("Hi",))]
    assert reference_answers(prompts) == {(1, 0): CODE}
    with pytest.raises(ConfigError, match="reference"):
        reference_answers(prompts[1:])


def test_cli_replays_a_prompt_files_references_with_gaps(tiny_gguf_dir, tmp_path):
    prompts = tmp_path / "dev.jsonl"
    prompts.write_text(json.dumps(Prompt(1, "edit", ("Repeat:\n" + CODE,), reference=CODE).to_dict()) + "\n")
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps(CostCurve(((1, 30.0), (64, 200.0))).to_dict()))
    args = ["replay", "--prompts", str(prompts), "--target", str(tiny_gguf_dir / "target.gguf"), "--free-lookups"]
    result = CliRunner().invoke(main, [*args, "--curve", str(curve), "--gaps", "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)
    assert got["all"]["ngram"]["oracle_speedup"] >= got["all"]["ngram"]["speedup"]
    assert got["gaps"] and {"place", "drafter", "gap_share"} <= set(got["gaps"][0])
    table = CliRunner().invoke(main, [*args, "--curve", str(curve), "--gaps"])
    assert table.exit_code == 0 and "where the hindsight optimum gains" in table.output
    missing = CliRunner().invoke(main, args)
    assert missing.exit_code == 2 and "--curve" in missing.output
    nothing = CliRunner().invoke(main, ["replay"])
    assert nothing.exit_code == 2 and "RESULTS" in nothing.output


def test_cli_replay_at_the_runs_own_prices(tiny_gguf_dir, tmp_path):
    out = _results(tmp_path, str(tiny_gguf_dir / "target.gguf"))
    results = json.loads((out / "results.json").read_text())
    curve = calibrated_curve(results)
    # Plain steps ran at the curve's price, 20-row forwards at twice it: drafting pays less.
    for record in results["records"]:
        record |= {"step_times": [[1, 50, curve.ms(1, 50), 31.0]] * 6, "decode_ms": 186.0}
    drafted = {"method": "auto", "question_id": 1, "turn": 0, "decode_ms": 1.0, "error": None}
    results["records"].append(drafted | {"step_times": [[20, 60, 2 * curve.ms(20, 60), 300.0]] * 6})
    (out / "results.json").write_text(json.dumps(results))
    args = ["replay", str(out), "--drafters", "ngram", "--free-lookups", "--oracle", "--json"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    calibrated = json.loads(first.output)
    ran = CliRunner().invoke(main, [*args, "--prices", "run"])
    assert ran.exit_code == 0, ran.output
    priced = json.loads(ran.output)
    assert [f for _, f in priced["run_price_factors"]] == pytest.approx([1.0, 2.0])
    assert priced["all"]["ngram"]["oracle_speedup"] < calibrated["all"]["ngram"]["oracle_speedup"]
    assert priced["all"]["ngram"]["speedup"] <= calibrated["all"]["ngram"]["speedup"]
    table = CliRunner().invoke(main, ["replay", str(out), "--drafters", "ngram", "--prices", "run"])
    assert table.exit_code == 0 and "pricedatthisrun'sforwards" in "".join(table.output.split())
    prompts = tmp_path / "prompts.jsonl"
    no_run = CliRunner().invoke(
        main, ["replay", "--prompts", str(prompts), "--curve", str(out / "results.json"), "--prices", "run"]
    )
    assert no_run.exit_code == 2 and "--prices run needs a bench run" in no_run.output
