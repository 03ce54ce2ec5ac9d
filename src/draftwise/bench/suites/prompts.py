"""Benchmark prompts: Spec-Bench JSONL files, the shipped suites, and context padding.

A prompt file holds one JSON object a line: {"question_id": int, "category": str,
"turns": [str, ...], "reference"?: ..., "json_schema"?: {...}, "prediction"?: str | [str | null, ...],
"suffix"?: str, "tools"?: [...], "tool_choice"?: ..., "expected_calls"?: [str, ...], "max_tokens"?: int};
a JSON schema constrains every turn's answer, for every method; tools (OpenAI's, with tool_choice,
default auto) do too, as the server would, and expected_calls names the functions the answer
should call (empty: none; bench/suites/tool_calls.py scores it); a prediction (one string for the first
turn, or one entry per turn) is the expected answer, which the prediction drafter drafts from; a
suffix makes a fill-in-the-middle prompt (one turn: the text before the gap; reference: the text
removed); max_tokens (a positive integer) caps each turn's answer in place
of the run's --max-tokens. Other keys (source, licence, language, context_label, ...) describe the
prompt and are ignored. Any problem is reported as `FILE:LINE: why`.
Suites ship in suites/<name>.jsonl; `full` is all of them but the opt-in ones (OPT_IN: `long`, an
hour on a CPU), `quick` two per category of `full`. One file loads in its own order (the long
suite's prompts that share a context are adjacent, so the engine reuses its cache); `full` and
`quick` are sorted by category.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from draftwise.types import ConfigError

CATEGORIES = (
    "code",
    "code_edit",
    "code_edit_long",
    "structured",
    "structured_schema",
    "chat",
    "multi_turn",
    "summarization",
    "rag",
    "math",
    "fim",
    "tool_calls",
    "long_rag",
    "long_code",
    "long_edit",
    "long_output",
    "long_chat",
)
QUICK_PER_CATEGORY = 2
SUITES = ("quick", "full")
OPT_IN = frozenset({"long"})  # suite files that `full` and `quick` leave out; `--suite long` loads one


class PromptFileError(ConfigError):
    """A prompt file is malformed; the message names the file and the line."""


@dataclass(frozen=True)
class Prompt:
    question_id: int
    category: str
    turns: tuple[str, ...]
    reference: Any = field(default=None, hash=False)
    json_schema: Any = field(default=None, hash=False)  # every answer must follow this JSON schema, if set
    prediction: tuple[str | None, ...] = ()  # per turn: the expected answer (predicted outputs), or None
    suffix: str | None = None  # fill in the middle: the text after the gap (turns[0] is the text before)
    tools: Any = field(default=None, hash=False)  # OpenAI tools every answer may call (tool_calls suite)
    tool_choice: Any = field(default=None, hash=False)  # None: auto
    expected_calls: tuple[str, ...] | None = None  # the functions a good answer calls (empty: none)
    max_tokens: int | None = None  # each turn's answer length, in place of the run's --max-tokens

    def prediction_for(self, turn: int) -> str | None:
        return self.prediction[turn] if turn < len(self.prediction) else None

    def to_dict(self) -> dict:
        out = {"question_id": self.question_id, "category": self.category, "turns": list(self.turns)}
        if self.reference is not None:
            out["reference"] = self.reference
        if self.json_schema is not None:
            out["json_schema"] = self.json_schema
        if any(p is not None for p in self.prediction):
            out["prediction"] = list(self.prediction)
        if self.suffix is not None:
            out["suffix"] = self.suffix
        if self.tools is not None:
            out["tools"] = self.tools
        if self.tool_choice is not None:
            out["tool_choice"] = self.tool_choice
        if self.expected_calls is not None:
            out["expected_calls"] = list(self.expected_calls)
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        return out


def parse_prompt(obj: Any) -> Prompt:
    """One decoded JSON value -> Prompt; raises ValueError saying what is wrong.

    Example: {"question_id": 7, "category": "math", "turns": ["2+2?"]} -> Prompt(7, "math", ("2+2?",)).
    """
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    qid = obj.get("question_id")
    if isinstance(qid, bool) or not isinstance(qid, int):
        raise ValueError(f"'question_id' must be an integer, got {qid!r}")
    category = obj.get("category")
    if not isinstance(category, str) or not category.strip():
        raise ValueError(f"'category' must be a non-empty string, got {category!r}")
    turns = obj.get("turns")
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"'turns' must be a non-empty list of strings, got {turns!r:.80}")
    for i, turn in enumerate(turns):
        if not isinstance(turn, str) or not turn.strip():
            raise ValueError(f"'turns'[{i}] must be a non-empty string, got {turn!r:.80}")
    schema = obj.get("json_schema")
    if schema is not None:
        if not isinstance(schema, dict):
            raise ValueError(f"'json_schema' must be a JSON schema object, got {schema!r:.80}")
        import jsonschema

        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"'json_schema' is not a valid JSON schema: {exc.message}") from None
    prediction = obj.get("prediction")
    if isinstance(prediction, str):
        prediction = [prediction]
    if prediction is not None:
        if (
            not isinstance(prediction, list)
            or not 1 <= len(prediction) <= len(turns)
            or not all(p is None or isinstance(p, str) for p in prediction)
        ):
            raise ValueError(
                f"'prediction' must be a string or a list of strings or nulls, one per turn (at most "
                f"{len(turns)}), got {prediction!r:.80}"
            )
    suffix = obj.get("suffix")
    if suffix is not None and (not isinstance(suffix, str) or len(turns) != 1 or schema is not None):
        raise ValueError(
            f"'suffix' (fill in the middle) must be a string, with one turn and no json_schema, got {suffix!r:.80}"
        )
    tools, expected = obj.get("tools"), obj.get("expected_calls")
    if tools is not None:
        from draftwise.tools import parse_tool_choice, parse_tools
        from draftwise.tools.spec import ToolSpecError

        try:
            parse_tool_choice(obj.get("tool_choice"), parse_tools(tools))
        except ToolSpecError as exc:
            raise ValueError(f"'{exc.param}': {exc}") from None
        if schema is not None or suffix is not None:
            raise ValueError("'tools' cannot go with a json_schema or a suffix")
    if (expected is not None or obj.get("tool_choice") is not None) and tools is None:
        raise ValueError("'expected_calls' and 'tool_choice' need 'tools'")
    if expected is not None and (not isinstance(expected, list) or not all(isinstance(n, str) for n in expected)):
        raise ValueError(f"'expected_calls' must be a list of function names, got {expected!r:.80}")
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"'max_tokens' must be a positive integer, got {max_tokens!r:.80}")
    return Prompt(
        qid,
        category.strip(),
        tuple(turns),
        obj.get("reference"),
        schema,
        tuple(prediction or ()),
        suffix,
        tools,
        obj.get("tool_choice"),
        tuple(expected) if expected is not None else None,
        max_tokens,
    )


def parse_lines(lines: Iterable[str], source: str) -> list[Prompt]:
    """Parse JSONL text; blank lines are skipped; question ids must be unique."""
    prompts: list[Prompt] = []
    seen: dict[int, int] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{source}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        try:
            prompt = parse_prompt(obj)
        except ValueError as exc:
            raise PromptFileError(f"{source}:{lineno}: {exc}") from None
        if prompt.question_id in seen:
            raise PromptFileError(
                f"{source}:{lineno}: question_id {prompt.question_id} already used on line {seen[prompt.question_id]}"
            )
        seen[prompt.question_id] = lineno
        prompts.append(prompt)
    return prompts


def load_prompts(path: str | Path) -> list[Prompt]:
    """Read a Spec-Bench-style JSONL file. Raises FileNotFoundError or PromptFileError."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    with path.open(encoding="utf-8") as f:
        prompts = parse_lines(f, str(path))
    if not prompts:
        raise PromptFileError(f"{path}: no prompts in the file")
    return prompts


def _suite_files() -> dict[str, Any]:
    folder = resources.files("draftwise.bench.suites")
    return {p.name[: -len(".jsonl")]: p for p in folder.iterdir() if p.name.endswith(".jsonl")}


def available_suites() -> list[str]:
    """'quick', 'full' and each shipped suite file's name (the opt-in ones too)."""
    return [*SUITES, *sorted(_suite_files())]


def load_suite(name: str) -> list[Prompt]:
    """'full': every shipped prompt but the opt-in files' (OPT_IN); 'quick': the first two of each
    of its categories; or one suite file, in its own order."""
    files = _suite_files()
    if name not in SUITES and name not in files:
        raise ConfigError(f"unknown suite {name!r}; choose one of {', '.join(available_suites())}")
    chosen = sorted(stem for stem in files if stem not in OPT_IN) if name in SUITES else [name]
    prompts: list[Prompt] = []
    seen: dict[int, str] = {}
    for stem in chosen:
        source = f"suites/{stem}.jsonl"
        for prompt in parse_lines(files[stem].read_text(encoding="utf-8").splitlines(), source):
            if prompt.question_id in seen:
                raise PromptFileError(
                    f"{source}: question_id {prompt.question_id} also used in {seen[prompt.question_id]}"
                )
            seen[prompt.question_id] = source
            prompts.append(prompt)
    if name not in SUITES:
        return prompts  # one file: its order (the long suite's shared contexts stay adjacent)
    order = {c: i for i, c in enumerate(CATEGORIES)}
    prompts.sort(key=lambda p: (order.get(p.category, len(order)), p.category, p.question_id))
    if name == "quick":
        prompts = take_per_category(prompts, QUICK_PER_CATEGORY)
    return prompts


def take_per_category(prompts: Sequence[Prompt], n: int) -> list[Prompt]:
    """The first n prompts of each category, order kept."""
    counts: dict[str, int] = {}
    out = []
    for p in prompts:
        if counts.get(p.category, 0) < n:
            counts[p.category] = counts.get(p.category, 0) + 1
            out.append(p)
    return out


def filter_categories(prompts: Sequence[Prompt], categories: Sequence[str] | None) -> list[Prompt]:
    """Keep the named categories; an unknown name is an error listing the ones present."""
    if not categories:
        return list(prompts)
    present = sorted({p.category for p in prompts})
    unknown = [c for c in categories if c not in present]
    if unknown:
        raise ConfigError(f"no prompts in categories {unknown}; present: {', '.join(present)}")
    return [p for p in prompts if p.category in set(categories)]


def pad_prompt(
    prompt: Prompt,
    num_tokens: int,
    filler_text: str,
    encode: Callable[[str], list[int]],
    decode: Callable[[Sequence[int]], str],
) -> Prompt:
    """Prefix the first turn with unrelated reference text so it is about num_tokens long.

    The filler is real text (other prompts of the suite), so the n-gram drafter and the
    draft model see the kind of distracting context a long conversation has. A prompt
    already at least that long is returned unchanged.
    """
    header = "Background material (not needed for the task below):\n\n"
    footer = "\n\n---\n\nTask:\n"
    have = len(encode(header + footer + prompt.turns[0]))
    room = num_tokens - have
    if room <= 0:
        return prompt
    filler_ids = encode(filler_text)
    if not filler_ids:
        raise ConfigError("no filler text to pad prompts with")
    while len(filler_ids) < room:
        filler_ids = filler_ids + filler_ids
    padding = decode(filler_ids[:room])
    first = header + padding + footer + prompt.turns[0]
    return replace(prompt, turns=(first, *prompt.turns[1:]))


def filler_for(prompt: Prompt, pool: Sequence[Prompt]) -> str:
    """Text of the other prompts (never the prompt itself), rotated so each prompt gets different filler."""
    others = [p for p in pool if p.question_id != prompt.question_id]
    if not others:
        others = list(pool)
    start = prompt.question_id % len(others)
    ordered = others[start:] + others[:start]
    return "\n\n".join(t for p in ordered for t in p.turns)
