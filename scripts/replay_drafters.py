"""Replay a bench run's baseline answers through the auto policy and free drafters, without the model.

Greedy decoding commits the target's argmax, so the baseline's answer is what every
speculative run commits too (up to llama.cpp's batched near-tie flips, DESIGN.md
section 7). Replaying it step by step with the real AutoPolicy and drafters, and a
fixed cost curve (optionally with random noise) in place of the target's timings, shows what each drafter set would
have got accepted and what it would have cost: no timing noise, seconds instead of a
half-hour bench, and the same decisions on every run. The suffix drafter keeps its
history across prompts in suite order, as in the bench.

    python scripts/replay_drafters.py runs/drafters-full/results.json [--datastore runs/stdlib-ds]

The cost curve is the run's own calibration (results meta), so a step verifying d draft
tokens costs curve(d + 1) and a plain step curve(1). Lookup time is measured and added.
Prints per category and drafter set: tokens per step and speedup (geo-mean over turns)
against plain decoding under the same curve.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections import defaultdict

DEFAULT_SETS = "ngram,suffix,ngram+suffix"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="a bench results.json with baseline records")
    ap.add_argument("--sets", default=DEFAULT_SETS, help=f"drafter sets to replay (default {DEFAULT_SETS})")
    ap.add_argument("--datastore", help="a datastore for sets that name 'datastore'")
    ap.add_argument("--categories", default="", help="only these categories (comma-separated)")
    ap.add_argument("--no-lookup-time", action="store_true",
                    help="count lookups as free and never back off from them: deterministic")
    ap.add_argument("--noise", type=float, default=0.0,
                    help="log-normal sigma of per-step timing noise, as on a shared machine (default 0)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the timing noise")
    args = ap.parse_args()

    import llama_cpp

    from draftwise import models
    from draftwise.backends.llamacpp import LlamaCppTokenizer
    from draftwise.bench.prompts import load_suite
    from draftwise.calibrate import CostCurve
    from draftwise.drafters.ngram import NgramDrafter
    from draftwise.drafters.suffix import SuffixDrafter
    from draftwise import policy_auto
    from draftwise.policy import PlanState
    from draftwise.policy_auto import AutoPolicy
    from draftwise.types import SpeculationConfig, StepStats

    rng = random.Random(args.seed)
    with open(args.results) as f:
        results = json.load(f)
    if args.no_lookup_time:  # the back-off reacts to measured lookup time, which varies
        policy_auto.LOOKUP_SHARE = float("inf")
    calibration = results["meta"].get("calibration", {}).get("target")
    if not calibration:
        raise SystemExit("this results file has no calibration in its meta (run it with an auto method)")
    curve = CostCurve(tuple(sorted((int(n), float(ms)) for n, ms in calibration.items())))
    llm = llama_cpp.Llama(str(models.model_path(models.DEFAULT_TARGET)), vocab_only=True, verbose=False)
    tok = LlamaCppTokenizer(llm, llama_cpp)
    answers = {(r["question_id"], r["turn"]): r["text"] for r in results["records"]
               if r["method"] == "baseline" and not r["error"]}
    wanted = set(filter(None, args.categories.split(",")))

    def make(name: str):
        if name == "ngram":
            return NgramDrafter()
        if name == "suffix":
            return SuffixDrafter()
        if name == "datastore":
            from draftwise.drafters.datastore import DatastoreDrafter

            return DatastoreDrafter(args.datastore)
        raise SystemExit(f"unknown drafter {name!r}")

    sets = {s: [make(n) for n in s.split("+")] for s in args.sets.split(",")}
    policies = {s: AutoPolicy(target_cost=curve, calibrate=False) for s in sets}
    per: dict[str, dict[str, list[tuple[int, int, float]]]] = defaultdict(lambda: defaultdict(list))
    for prompt in load_suite("full"):
        history: list[dict] = []
        for turn, text in enumerate(prompt.turns):
            answer = answers.get((prompt.question_id, turn))
            if answer is None:
                break
            messages = [*history, {"role": "user", "content": text}]
            prompt_ids = tok.encode(tok.apply_chat_template(messages), add_special=True)
            answer_ids = tok.encode(answer, add_special=False)
            history = [*messages, {"role": "assistant", "content": answer}]
            for name, drafters in sets.items():
                policy = policies[name]
                policy.begin(drafters, SpeculationConfig())
                steps, ms, pos = 0, 0.0, 0
                while pos < len(answer_ids):
                    context = prompt_ids + answer_ids[:pos]
                    t0 = time.perf_counter()
                    plan = policy.plan(PlanState(context=context, max_k=len(answer_ids) - pos - 1))
                    draft = plan.draft
                    if draft is None and plan.drafter is not None and plan.k > 0:
                        draft = plan.drafter.propose(context, plan.k)
                    lookup_ms = 0.0 if args.no_lookup_time else 1000 * (time.perf_counter() - t0)
                    proposal = draft.token_ids[: plan.k] if draft is not None else ()
                    accepted = 0
                    while accepted < len(proposal) and proposal[accepted] == answer_ids[pos + accepted]:
                        accepted += 1
                    verify_ms = curve.ms(len(proposal) + 1) * (rng.lognormvariate(0.0, args.noise) if args.noise else 1.0)
                    policy.observe(StepStats(drafter=plan.drafter.name if proposal else "none",
                                             num_drafted=len(proposal), num_accepted=accepted,
                                             num_committed=accepted + 1, draft_ms=lookup_ms, verify_ms=verify_ms))
                    steps += 1
                    ms += lookup_ms + verify_ms
                    pos += accepted + 1
                if not wanted or prompt.category in wanted:
                    per[prompt.category][name].append((len(answer_ids), steps, len(answer_ids) * curve.ms(1) / ms))
    names = list(sets)
    width = max(16, *(len(n) + 2 for n in names))
    print(f"tokens/step · speedup (geo-mean), cost curve {dict(curve.points)}")
    print("category".ljust(14) + "".join(n.rjust(width) for n in names))
    overall: dict[str, list[float]] = defaultdict(list)
    for cat, by_set in per.items():
        cells = []
        for n in names:
            rows = by_set[n]
            overall[n] += [r[2] for r in rows]
            geo = math.exp(sum(math.log(r[2]) for r in rows) / len(rows))
            cells.append(f"{sum(r[0] for r in rows) / sum(r[1] for r in rows):.2f} · {geo:.3f}".rjust(width))
        print(cat.ljust(14) + "".join(cells))
    print("all".ljust(14) + "".join(
        f"{math.exp(sum(map(math.log, overall[n])) / len(overall[n])):.3f}".rjust(width) for n in names))
    if not args.no_lookup_time:
        print("lookup ms (smoothed, last):", {n: policies[n].snapshot()["lookup_ms"] for n in names})


if __name__ == "__main__":
    main()
