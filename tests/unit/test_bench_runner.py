"""The bench runner on the toy backend: complete records, speedup against the same prompt's
baseline, the identical flag, sweeps, failing methods, and resume after an interruption.
"""

import dataclasses
import json

import pytest

from draftwise.backends.toy import ToyBackend, ToyModel
from draftwise.bench.record.timing import WindowClock
from draftwise.bench.reports.report import render_markdown
from draftwise.bench.suites.prompts import Prompt
from draftwise.bench.sweep.methods import parse_method
from draftwise.bench.sweep.runner import BenchConfig, BenchRunner, divergence, run_bench
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.engine import Engine
from draftwise.types import ConfigError, SamplingParams

SECTION_5 = (
    "num_drafted",
    "num_accepted",
    "num_steps",
    "acceptance_rate",
    "mean_accepted_tokens",
    "tokens_per_step",
    "accepted_per_position",
    "tokens_per_second",
    "tokens_per_second_e2e",
)
BENCH_FIELDS = (
    "category",
    "question_id",
    "method",
    "turn",
    "new_tokens",
    "prefill_ms",
    "decode_tokens_per_second",
    "speedup",
    "identical_to_baseline",
    "peak_rss_mb",
    "tokens_per_second_windows",
    "memory_overhead_mb",
)
PROMPTS = [
    Prompt(11, "code", ("def add(a, b): return a + b. now write sub",)),
    Prompt(12, "chat", ("tell me a story about a cat",)),
    Prompt(13, "multi_turn", ("name three fruits", "now sort them")),
]


def toy_engine(draft_seed: int = 0) -> Engine:
    target = ToyModel(vocab_size=40, sharpness=3)
    draft = ToyModel(vocab_size=40, sharpness=3, seed=draft_seed)
    return Engine(ToyBackend(target), [ModelDrafter(ToyBackend(draft), name="draft"), NgramDrafter(1, 3)])


class Wrapped:
    """An engine whose results pass through `adjust(result, messages, drafters)` (fake timings, tampering)."""

    def __init__(self, engine, adjust):
        self.engine, self.adjust = engine, adjust
        self.target, self.drafters, self.tokenizer = engine.target, engine.drafters, engine.tokenizer
        self.encode_prompt = engine.encode_prompt
        self.num_streams = 0

    def generate(self, *args, **kwargs):
        return self.engine.generate(*args, **kwargs)

    def stream(self, *, messages, drafters=None, **kwargs):
        self.num_streams += 1
        inner = self.engine.stream(messages=messages, drafters=drafters, **kwargs)
        outer = self

        class Gen:
            result = None

            def __iter__(self):
                yield from inner
                self.result = outer.adjust(inner.result, messages, drafters)

        return Gen()


def run(engine, tmp_path, prompts=PROMPTS, **config):
    config.setdefault("max_tokens", 40)
    return run_bench(engine, prompts, BenchConfig(**config), tmp_path)


def test_records_are_complete_one_per_prompt_turn_and_method(tmp_path):
    results = run(toy_engine(), tmp_path, methods=("baseline", "draft", "ngram", "heuristic"))
    records = results["records"]
    expected = {
        (p.question_id, t, m)
        for p in PROMPTS
        for t in range(len(p.turns))
        for m in ("baseline", "draft", "ngram", "heuristic")
    }
    assert {(r["question_id"], r["turn"], r["method"]) for r in records} == expected
    assert len(records) == len(expected)
    for r in records:
        assert r["error"] is None
        for key in SECTION_5 + BENCH_FIELDS:
            assert key in r, key
        assert r["new_tokens"] == r["num_generated"] > 0
        assert r["category"] == {p.question_id: p.category for p in PROMPTS}[r["question_id"]]
        assert r["peak_rss_mb"] > 0
    assert results["complete"] is True
    assert json.loads((tmp_path / "results.json").read_text()) == results


def test_speedup_is_against_the_same_prompt_and_turns_baseline(tmp_path):
    # Fake decode times: baseline of prompt i takes i ms per token, every other method half that.
    slowness = {p.turns[0]: i + 1 for i, p in enumerate(PROMPTS)}

    def adjust(result, messages, drafters):
        per_token = slowness[messages[0]["content"]] * (1.0 if not drafters else 0.5) * (1 + len(messages) // 2)
        result.stats.decode_ms = per_token * result.stats.num_generated
        return result

    records = run(Wrapped(toy_engine(), adjust), tmp_path, methods=("baseline", "ngram", "draft"))["records"]
    base = {(r["question_id"], r["turn"]): r for r in records if r["method"] == "baseline"}
    for r in records:
        b = base[(r["question_id"], r["turn"])]
        assert r["speedup"] == pytest.approx(r["decode_tokens_per_second"] / b["decode_tokens_per_second"])
        assert r["speedup"] == pytest.approx(1.0 if r["method"] == "baseline" else 2.0)


def test_identical_flag_compares_token_ids_with_baseline(tmp_path):
    def tamper(result, messages, drafters):
        if drafters == ["ngram"]:  # one wrong token in the n-gram method's output
            ids = list(result.token_ids)
            ids[-1] = ids[-1] % 39 + 1
            return dataclasses.replace(result, token_ids=ids)
        return result

    results = run(Wrapped(toy_engine(), tamper), tmp_path, methods=("baseline", "draft", "ngram"))
    records = results["records"]
    flags = {(r["method"], r["question_id"], r["turn"]): r["identical_to_baseline"] for r in records}
    assert all(v is False for (m, *_), v in flags.items() if m == "ngram")
    assert all(v is True for (m, *_), v in flags.items() if m in ("baseline", "draft"))
    # each differing answer says where it leaves plain decoding's and by how much
    for r in records:
        if r["method"] != "ngram":
            assert "divergence" not in r
            continue
        d = r["divergence"]
        assert d["position"] == r["new_tokens"] - 1 and d["plain_token"] != d["other_token"]
        assert d["gap_nats"] is None or d["gap_nats"] > 0  # plain's token is its row's argmax
        assert "_prompt" not in r and "_token_ids" not in r
    assert "## Greedy answers that differ from plain decoding" in render_markdown(results)


def test_divergence_gap_is_the_logprob_difference_in_plain_decodings_row():
    engine = toy_engine()
    prompt = engine.encode_prompt("abc")
    plain = engine.generate(prompt_ids=prompt, sampling=SamplingParams(max_tokens=6, ignore_eos=True)).token_ids
    row = engine.generate(
        prompt_ids=[*prompt, *plain[:3]], sampling=SamplingParams(max_tokens=1, logprobs=20, ignore_eos=True)
    ).logprobs[0]
    second = row.top[1][0]
    other = [*plain[:3], second, *plain[4:]]
    d = divergence(engine, prompt, list(plain), other)
    assert d["position"] == 3 and d["gap_nats"] == pytest.approx(row.top[0][1] - row.top[1][1], abs=1e-4)
    assert d["reproduced"]
    assert divergence(engine, prompt, list(plain), list(plain[:4]))["note"]  # a prefix: it stopped earlier
    # A "plain" answer that plain decoding run again does not reproduce (on llama.cpp: its cache
    # filled otherwise): the row is read after that answer's own tokens, not on another path.
    detour = [*plain[:2], row.top[2][0], *plain[3:]]
    forced_row = engine.generate(
        prompt_ids=[*prompt, *detour[:3]], sampling=SamplingParams(max_tokens=1, logprobs=20, ignore_eos=True)
    ).logprobs[0]
    top = dict(forced_row.top)
    third = [*detour[:3], forced_row.top[1][0]]
    d = divergence(engine, prompt, [*detour[:3], forced_row.top[0][0]], third)
    assert d["position"] == 3 and not d["reproduced"] and d["forced"]
    assert d["gap_nats"] == pytest.approx(top[forced_row.top[0][0]] - top[third[3]], abs=1e-4)


def test_identical_is_not_claimed_for_sampled_runs_and_sweeps_make_one_set_per_setting(tmp_path):
    records = run(
        toy_engine(draft_seed=5),
        tmp_path,
        prompts=PROMPTS[:1],
        methods=("baseline", "draft", "ngram"),
        temperatures=(0.0, 0.8),
        ks=(1, 3),
        draft_temperatures=(None, 1.0),
    )["records"]
    combos = {(r["method"], r["temperature"], r["k"], r["draft_temperature"]) for r in records}
    # baseline once per temperature; ngram per k; the draft model per k x draft temperature
    assert len(records) == len(combos) == 2 * (1 + 2 + 2 * 2)
    assert all(r["identical_to_baseline"] is None for r in records if r["temperature"] > 0)
    assert all(r["identical_to_baseline"] is True for r in records if r["temperature"] == 0)
    assert all(r["speedup"] is not None for r in records)


def test_branches_sweep_applies_to_fixed_ngram_only_and_stays_identical(tmp_path):
    prompts = [Prompt(21, "code_edit", ("a b c a b d a b c a b d a b",))]
    records = run(
        toy_engine(),
        tmp_path,
        prompts=prompts,
        methods=("baseline", "ngram", "draft", "auto:ngram"),
        ks=(3,),
        branches=(1, 3),
    )["records"]
    combos = sorted((r["method"], r["branches"]) for r in records)
    assert combos == [("auto:ngram", 1), ("baseline", 1), ("draft", 1), ("ngram", 1), ("ngram", 3)]
    assert all(r["identical_to_baseline"] is True for r in records)
    tree = next(r for r in records if r["branches"] == 3)
    assert tree["num_tree_steps"] >= 1 and tree["error"] is None  # "a b" continues with " c" or " d"
    with pytest.raises(ConfigError, match="branches"):
        BenchConfig(branches=(0,))


def test_a_failing_method_records_an_error_and_the_run_goes_on(tmp_path):
    class Boom(NgramDrafter):
        def propose(self, context, max_tokens, grammar=None):
            raise RuntimeError("drafter exploded")

    engine = toy_engine()
    engine.drafters.append(Boom(name="boom"))
    records = run(engine, tmp_path, methods=("baseline", "fixed:boom", "ngram"))["records"]
    failed = [r for r in records if r["method"] == "fixed:boom"]
    assert len(failed) == 4 and all("drafter exploded" in r["error"] for r in failed)
    assert any(r["error"].startswith("skipped: turn 0 failed") for r in failed)  # the second turn of multi_turn
    assert all(r["error"] is None and r["speedup"] for r in records if r["method"] != "fixed:boom")


def test_resume_finishes_an_interrupted_run_without_redoing_saved_prompts(tmp_path):
    class StopAfter:
        def __init__(self, n):
            self.n = n

        def start(self, total):
            pass

        def update(self, description):
            pass

        def advance(self, n=1):
            self.n -= n
            if self.n < 0:
                raise KeyboardInterrupt

        def close(self):
            pass

    config = BenchConfig(methods=("baseline", "ngram"), max_tokens=30)
    with pytest.raises(KeyboardInterrupt):
        BenchRunner(toy_engine(), PROMPTS, config, tmp_path, progress=StopAfter(3)).run()
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["complete"] is False
    assert {r["question_id"] for r in saved["records"]} == {11}  # prompt 12 was cut off mid-way: not saved
    with pytest.raises(ConfigError, match="already exists"):
        BenchRunner(toy_engine(), PROMPTS, config, tmp_path)
    with pytest.raises(ConfigError, match="max_tokens was 30, now 31"):
        BenchRunner(toy_engine(), PROMPTS, dataclasses.replace(config, max_tokens=31), tmp_path, resume=True)

    engine = Wrapped(toy_engine(), lambda result, *_: result)
    results = BenchRunner(engine, PROMPTS, config, tmp_path, resume=True).run()
    assert engine.num_streams == 2 * (1 + 2)  # prompts 12 and 13 (two turns) x two methods
    assert results["complete"] is True
    keys = [(r["question_id"], r["turn"], r["method"]) for r in results["records"]]
    assert sorted(keys) == sorted(
        (p.question_id, t, m) for p in PROMPTS for t in range(len(p.turns)) for m in ("baseline", "ngram")
    )
    assert results["records"][: len(saved["records"])] == saved["records"]


def test_repeats_keep_the_median_run(tmp_path):
    records = run(toy_engine(), tmp_path, prompts=PROMPTS[:1], methods=("baseline", "ngram"), repeats=3)["records"]
    for r in records:
        runs = r["repeats_tokens_per_second"]
        assert len(runs) == 3 and r["decode_tokens_per_second"] == sorted(runs)[1]


def test_context_sweep_pads_prompts_and_records_the_length(tmp_path):
    records = run(
        toy_engine(), tmp_path, prompts=PROMPTS[:2], methods=("baseline", "ngram"), context_lengths=(64, 512)
    )["records"]
    assert {r["context_tokens"] for r in records} == {64, 512}
    for r in records:
        if r["context_tokens"] == 512:
            assert 480 <= r["num_prompt_tokens"] <= 560


def test_window_clock_gives_tokens_per_second_per_window():
    clock = WindowClock()
    clock.times, clock.chars = [0.5, 1.0, 1.5, 2.0], [16, 32, 48, 64]  # 64 one-char tokens over 2 s
    ids = list(range(1, 65))
    assert clock.windows(ids, lambda xs: "x" * len(xs), decode_start_s=0.0, window=32) == [32.0, 32.0]
    # One piece carrying 40 tokens at once is spread over its step instead of arriving "instantly".
    clock.times, clock.chars = [1.0, 1.2], [40, 64]
    rates = clock.windows(ids, lambda xs: "x" * len(xs), decode_start_s=0.0, window=32)
    assert rates[0] == pytest.approx(40.0) and rates[1] == pytest.approx(32 / (1.2 - 0.8))


def test_method_names():
    available = ["ngram", "draft"]
    assert parse_method("baseline", available).enabled is False
    assert parse_method("draft", available).drafters == ("draft",)
    assert parse_method("heuristic", ["ngram"]).drafters == ("ngram",)
    assert parse_method("auto", available).drafters == ("ngram", "draft")
    combo = parse_method("ngram+draft", available)
    assert (combo.policy, combo.drafters) == ("auto", ("ngram", "draft"))
    assert parse_method("heuristic:ngram", available).policy == "heuristic"
    with pytest.raises(ConfigError, match="needs drafter 'draft', which is not loaded"):
        parse_method("draft", ["ngram"])
    with pytest.raises(ConfigError, match="only auto chooses"):
        parse_method("fixed:ngram+draft", available)
    with pytest.raises(ConfigError, match="not a policy"):
        parse_method("greedy:ngram", available)


def test_later_turns_continue_from_the_baselines_answer(tmp_path):
    seen: dict[str, list] = {}

    def tamper(result, messages, drafters):
        name = "+".join(drafters or ["baseline"])
        seen.setdefault(name, []).append(messages)
        if drafters == ["ngram"] and len(messages) == 1:  # numerics flipped a near-tie in turn 1
            return dataclasses.replace(result, text="a different answer")
        return result

    run(Wrapped(toy_engine(), tamper), tmp_path, prompts=PROMPTS[2:], methods=("ngram", "baseline"))
    baseline_answer = seen["baseline"][1][1]
    assert baseline_answer["role"] == "assistant" and baseline_answer["content"] != "a different answer"
    assert seen["ngram"][1][1] == baseline_answer  # turn 2 of every method sees the same conversation


def test_drift_corrected_speedup_counts_time_in_each_runs_own_plain_steps():
    from draftwise.bench.sweep.compare import compare_with_baseline as _compare_with_baseline

    def rec(policy, steps_ms, plain, tokens=100):
        decode = sum(steps_ms)
        return {
            "turn": 0,
            "policy_name": policy,
            "num_generated": tokens,
            "decode_ms": decode,
            "decode_tokens_per_second": 1000 * tokens / decode,
            "num_plain_steps": plain,
            "plain_step_ms": sum(steps_ms[:plain]),
            "_token_ids": [1],
        }

    base = rec("none", [30.0] * 100, 100)
    # Twice as slow a machine: plain steps take 60 ms; 20 plain + 20 steps of 4 tokens at 150 ms.
    method = rec("auto", [60.0] * 20 + [150.0] * 20, 20)
    few = rec("auto", [60.0] * 5 + [150.0] * 24, 5, tokens=101)  # too few plain steps to time the unit
    _compare_with_baseline([base, method, few], greedy=True)
    assert method["speedup"] == pytest.approx(3000 / 4200)  # raw: the slow machine hides the gain
    assert method["speedup_drift_corrected"] == pytest.approx((100 * 60 / 4200) / (100 * 30 / 3000))
    assert base["speedup_drift_corrected"] == pytest.approx(1.0)
    assert few["speedup_drift_corrected"] is None and few["speedup"] is not None


def test_prompts_with_a_json_schema_are_constrained_for_every_method_but_unconstrained_ones(tmp_path):
    schema = {
        "type": "object",
        "properties": {"a": {"enum": ["x", "yy"]}, "b": {"type": "integer", "maximum": 99}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    target = ToyModel(vocab_size=90, sharpness=3)
    engine = Engine(ToyBackend(target), [NgramDrafter(1, 3)])
    prompts = [Prompt(21, "structured_schema", ("a record",), json_schema=schema), Prompt(22, "chat", ("hi",))]
    records = run(engine, tmp_path, methods=("baseline", "baseline@unconstrained", "ngram"), prompts=prompts)["records"]
    structured = {r["method"]: r for r in records if r["question_id"] == 21}
    assert structured["baseline"]["constrained"] and structured["ngram"]["constrained"]
    assert not structured["baseline@unconstrained"]["constrained"]
    for name in ("baseline", "ngram"):
        assert structured[name]["schema_valid"] and json.loads(structured[name]["text"])["a"] in ("x", "yy")
        assert structured[name]["num_masks"] > 0
    assert structured["ngram"]["identical_to_baseline"]  # compared with the constrained baseline
    assert structured["ngram"]["num_forced_tokens"] > 0
    assert structured["baseline@unconstrained"]["schema_valid"] is False
    assert structured["baseline@unconstrained"]["speedup"] == 1.0
    assert structured["baseline"]["speedup_vs_unconstrained"] > 0
    chat = [r for r in records if r["question_id"] == 22]
    assert not any(r["constrained"] or "json_valid" in r for r in chat)


def test_fill_in_the_middle_prompts_run_as_infill_and_score_the_middle(tmp_path):
    from draftwise.bench.reports.report import render_markdown
    from draftwise.bench.suites.fim import fim_ids
    from draftwise.types import SamplingParams, SpeculationConfig

    target = ToyBackend(ToyModel(vocab_size=100, sharpness=3))
    target.tokenizer.fim_token_ids = lambda: {"prefix": 97, "suffix": 98, "middle": 99}
    engine = Engine(target, [NgramDrafter(1, 3)])
    cut = Prompt(31, "fim", ("def f(x):\n    y = x + 1\n",), suffix="    return y\n")
    ids = fim_ids(engine.tokenizer, cut)
    plain = engine.generate(
        prompt_ids=ids, sampling=SamplingParams(max_tokens=40), speculation=SpeculationConfig(enabled=False)
    )
    prompts = [
        dataclasses.replace(cut, reference=plain.text),
        dataclasses.replace(cut, question_id=32, reference="    z = 0\n"),
        Prompt(33, "chat", ("hi",)),
    ]
    results = run(engine, tmp_path, methods=("baseline", "ngram"), prompts=prompts)
    by_key = {(r["question_id"], r["method"]): r for r in results["records"]}
    for method in ("baseline", "ngram"):
        right, wrong = by_key[(31, method)], by_key[(32, method)]
        assert right["num_prompt_tokens"] == len(ids) and right["text"] == plain.text  # the /infill prompt
        assert right["exact_match"] is True and right["edit_similarity"] == 1.0
        assert wrong["exact_match"] is False and wrong["edit_similarity"] < 1.0
        assert right["speedup"] is not None and "exact_match" not in by_key[(33, method)]
    assert by_key[(31, "ngram")]["identical_to_baseline"]
    report = render_markdown(results)
    assert "## Code completion (fill in the middle)" in report
    assert "| 0 | ngram k=4 | 2 | 50% |" in report


def test_the_first_prompt_of_each_category_keeps_its_answers_token_sources(tmp_path):
    prompts = [*PROMPTS, Prompt(14, "code", ("def mul(a, b): return a * b. now write div",))]
    results = run(toy_engine(), tmp_path, prompts=prompts, methods=("baseline", "ngram"), temperatures=(0.0, 0.7))
    traced = {(r["question_id"], r["turn"], r["temperature"], r["method"]) for r in results["records"] if "spans" in r}
    # The first prompt of each category, its first turn, the first temperature; every method.
    assert traced == {(q, 0, 0.0, m) for q in (11, 12, 13) for m in ("baseline", "ngram")}
    for r in results["records"]:
        if "spans" not in r:
            continue
        assert "".join(text for text, *_ in r["spans"]) == r["text"]
        assert all(len(span) == 5 and span[2] >= 1 for span in r["spans"])
        sources = {source for _, source, *_ in r["spans"]}
        assert sources == {"target"} if r["method"] == "baseline" else sources <= {"target", "ngram"}
        assert sources == {s for s, n in r["tokens_by_source"].items() if n}


def test_records_carry_the_kv_caches_and_the_drafters_memory(tmp_path):
    from draftwise.backends.toy import KV_TOKEN_BYTES
    from draftwise.drafters.suffix import SuffixDrafter

    engine = toy_engine()
    engine.drafters.append(SuffixDrafter())
    results = run(engine, tmp_path, methods=("baseline", "draft", "ngram", "ngram+suffix"))
    memory = results["meta"]["memory"]
    assert memory["target_weights_mb"] == memory["draft_weights_mb"] == 0.0  # the toy's logits need no weights
    for r in results["records"]:
        held = r["num_prompt_tokens"] + r["new_tokens"]
        # What the run leaves cached: its prompt and answer (the last token is never fed back).
        assert held - 1 <= r["kv_target_bytes"]["used"] / KV_TOKEN_BYTES <= held
        assert r["kv_target_bytes"]["allocated"] == r["kv_target_bytes"]["used"]
        assert ("kv_draft_bytes" in r) == (r["method"] == "draft")
        expected = {"baseline": set(), "draft": set(), "ngram": {"ngram"}, "ngram+suffix": {"ngram", "suffix"}}
        assert set(r["drafter_bytes"]) == expected[r["method"]]
        assert all(n > 0 for n in r["drafter_bytes"].values())
        if r["method"] == "draft":
            assert 0 < r["kv_draft_bytes"]["used"] <= r["kv_target_bytes"]["used"]
    report = render_markdown(results)
    assert "| method | n | RSS MB | peak RSS MB | target KV used MB |" in report
    assert "| baseline | 4 |" in report and "| ngram+suffix k=4 | 4 |" in report
