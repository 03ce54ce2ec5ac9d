"""The tool_calls suite's side of the bench: a prompt's tools and tool_choice become the plan every
method decodes under (draftwise.tools: the same constraint for plain decoding and for speculation),
and an answer is scored against the prompt's expected calls; tool_rows() is the report's table.

Example record scores: {"tool_calls": ["read_file"], "tool_parse": True, "tool_names_exist": True,
"tool_args_valid": True, "tool_decision": True} for an expected ["read_file"].
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from draftwise.tools import ToolPlan, parse_tool_choice, parse_tools, tool_plan


def plan_for(tokenizer, tools: Sequence[dict], tool_choice: Any) -> ToolPlan:
    """The plan of a prompt's tools and tool_choice (None: auto), as the server builds it."""
    parsed = parse_tools(tools)
    return tool_plan(tokenizer, parsed, parse_tool_choice(tool_choice, parsed))


def scores(text: str, plan: ToolPlan, expected: Sequence[str]) -> dict:
    """tool_parse: the answer is text or calls that all parse (a call cut short or broken is not);
    tool_names_exist / tool_args_valid: every call names a tool / its arguments validate against
    that tool's parameters (jsonschema; vacuously true without calls); tool_decision: the set of
    called functions is the expected one (empty: no call expected)."""
    import jsonschema

    parsed = plan.parse(text)
    parser = plan.parser()
    parser.feed(text)
    parser.finish()
    schemas = {t.name: t.parameters for t in plan.tools}
    names = [c.name for c in parsed.calls]
    valid = True
    for call in parsed.calls:
        try:
            arguments = json.loads(call.arguments)
        except json.JSONDecodeError:
            valid = False
            continue
        schema = schemas.get(call.name)
        valid = valid and schema is not None and jsonschema.validators.validator_for(schema)(schema).is_valid(arguments)
    return {
        "tool_calls": names,
        "tool_parse": not parser.broken,
        "tool_names_exist": all(n in schemas for n in names),
        "tool_args_valid": valid,
        "tool_decision": sorted(set(names)) == sorted(set(expected)),
    }


def tool_rows(records: Sequence[dict]) -> list[tuple]:
    """Per temperature x method over tool_calls records: n, calls that parse, names that exist,
    arguments that validate, decisions as expected (shares), mean tok/s, geometric-mean speedup
    over plain decoding under the same constraint, answers identical to plain decoding's."""
    rows = []
    scored = [r for r in records if "tool_decision" in r and not r.get("error")]
    for temperature in sorted({float(r["temperature"]) for r in scored}):
        group = [r for r in scored if float(r["temperature"]) == temperature]
        for method in dict.fromkeys(r["method"] for r in group):
            rs = [r for r in group if r["method"] == method]
            same = [r["identical_to_baseline"] for r in rs if r.get("identical_to_baseline") is not None]
            speedups = [r["speedup"] for r in rs if r.get("speedup")]
            speedup = math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else None
            rows.append(
                (
                    f"{temperature:g}",
                    method,
                    len(rs),
                    *(f"{sum(r[key] for r in rs) / len(rs):.0%}" for key in SCORES),
                    f"{sum(r['decode_tokens_per_second'] for r in rs) / len(rs):.1f}",
                    "-" if speedup is None else f"{speedup:.2f}x",
                    f"{sum(same)}/{len(same)}" if same else "-",
                )
            )
    return rows


SCORES = ("tool_parse", "tool_names_exist", "tool_args_valid", "tool_decision")
TOOL_HEADERS = ("T", "method", "n", "parse", "names exist", "args valid", "decision", "tok/s", "speedup", "identical")
