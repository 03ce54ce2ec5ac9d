"""Speed of tool-call answers: plain decoding against speculative (auto policy) decoding, both
under the same tool constraint, greedy, on the default pair. --tool-choice required (default):
the call's grammar from the first token; auto: the lazy grammar (Qwen2.5-Coder 1.5B answers these
prompts with a ```json block rather than <tool_call>; the JSON-block pattern trigger takes such a
block as calls).

Prints per prompt the answer's tokens, decode tokens/s of each method, whether the answers are
identical and whether the calls parse and validate; then the totals (tokens over decode time).
Usage: python scripts/measure_tool_calls.py [--tool-choice required|auto] [--max-tokens 160]
       [--draft ngram,qwen2.5-coder-0.5b-instruct]
"""

from __future__ import annotations

import argparse
import json

import jsonschema

from draftwise import models
from draftwise.backends.base import encode_chat
from draftwise.loading import load_engine
from draftwise.tools import ToolChoice, parse_tools, tool_plan
from draftwise.types import SamplingParams, SpeculationConfig

FILE = """def load_config(path):
    with open(path) as f:
        return json.load(f)


def save_config(path, config):
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
"""
TOOLS = parse_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file of the repository.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "edit_file",
                "description": "Replace the text `old` by `new` in a file.",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
                    "required": ["path", "old", "new"],
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "run_tests",
                "description": "Run the tests in a file or folder.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The current weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        },
    ]
)
PROMPTS = [
    "Show me what is in src/draftwise/tools/formats/hermes.py.",
    "What's the weather like in Lisbon right now?",
    "Run the tests in tests/server/test_tools.py, please.",
    f"In src/app/config.py, which reads:\n\n{FILE}\nchange `indent=2` to `indent=4` with the edit tool.",
    f"Here is src/app/config.py:\n\n{FILE}\nRename load_config to read_config in that file using edit_file.",
    "Read both README.md and docs/bench/README.md.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--draft", default=f"ngram,{models.DEFAULT_DRAFT}")
    parser.add_argument("--tool-choice", default="required", choices=["required", "auto"])
    args = parser.parse_args()
    engine = load_engine(models.DEFAULT_TARGET, args.draft, speculation=SpeculationConfig(policy="auto"))
    plan = tool_plan(engine.tokenizer, TOOLS, ToolChoice(args.tool_choice))
    schemas = {t.name: t.parameters for t in TOOLS}
    sampling = SamplingParams(max_tokens=args.max_tokens, constraint=plan.constraint)
    methods = {"plain": SpeculationConfig(enabled=False), "auto": SpeculationConfig(policy="auto")}
    totals = {m: [0, 0.0] for m in methods}
    for prompt in PROMPTS:
        ids = encode_chat(engine.tokenizer, [{"role": "user", "content": prompt}], tools=[t.as_openai() for t in TOOLS])
        results = {m: engine.generate(prompt_ids=ids, sampling=sampling, speculation=s) for m, s in methods.items()}
        parsed = plan.format.parse(results["auto"].text)
        valid = all(
            c.name in schemas and jsonschema.validate(json.loads(c.arguments), schemas[c.name]) is None
            for c in parsed.calls
        )
        row = []
        for m, r in results.items():
            totals[m][0] += r.stats.num_generated
            totals[m][1] += r.stats.decode_ms
            row.append(f"{m} {1000 * r.stats.num_generated / r.stats.decode_ms:5.1f} tok/s")
        print(
            f"{results['plain'].stats.num_generated:4d} tokens | {' | '.join(row)} | "
            f"identical {results['plain'].token_ids == results['auto'].token_ids} | "
            f"calls {[c.name for c in parsed.calls]} valid {valid} | {prompt[:40]!r}",
            flush=True,
        )
    speed = {m: 1000 * n / ms for m, (n, ms) in totals.items()}
    print(
        f"total: plain {speed['plain']:.1f} tok/s, auto {speed['auto']:.1f} tok/s, "
        f"auto/plain {speed['auto'] / speed['plain']:.2f}x (decode time, same constraint, greedy)"
    )


if __name__ == "__main__":
    main()
