"""The bench's results file: its format tag, atomic saves, loading for a resume (refused when
the settings differ), the unit a resume skips whole (a prompt at one context and temperature),
and the compact form of an answer's token sources.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from draftwise.types import ConfigError, TokenSpan

FORMAT = "draftwise-bench/1"


def save_results(path: Path, results: dict) -> None:
    """Write atomically (temp file + rename): a crash mid-write never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, allow_nan=False))
    os.replace(tmp, path)


def load_results(path: Path) -> dict:
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno}); cannot resume") from None
    if results.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a draftwise bench results file (format {results.get('format')!r})")
    return results


def unit_key(question_id: int, context_tokens: int | None, temperature: float) -> tuple:
    """A prompt at one context length and temperature: the unit that is saved (and resumed) whole."""
    return (int(question_id), context_tokens, float(temperature))


def check_same_run(results: dict, config: dict, meta: dict, path: Path) -> None:
    """Refuse to resume results made with other settings (config: BenchConfig.to_dict())."""
    old, new = results.get("config", {}), config
    for key in new:
        if norm(old.get(key)) != norm(new[key]):
            raise ConfigError(
                f"cannot resume {path}: {key} was {old.get(key)!r}, now {new[key]!r}; "
                "use the same settings or another --out"
            )
    for key in ("target", "draft_model"):
        if key in meta and results.get("meta", {}).get(key) != meta[key]:
            raise ConfigError(f"cannot resume {path}: {key} was {results['meta'].get(key)!r}, now {meta[key]!r}")


def compact_spans(spans: Sequence[TokenSpan]) -> list[list]:
    """An answer's TokenSpans as stored: [text, source, step, drafted, accepted] lists, the
    consecutive spans of one source in one step joined (a step's accepted draft is one span).

    Example: spans "a"/ngram/step 1, "b"/ngram/step 1, "c"/target/step 1 ->
    [["ab", "ngram", 1, 2, 2], ["c", "target", 1, 2, 2]].
    """
    out: list[list] = []
    for s in spans:
        if out and out[-1][1] == s.source and out[-1][2] == s.step:
            out[-1][0] += s.text
        else:
            out.append([s.text, s.source, s.step, s.drafted, s.accepted])
    return out


def norm(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=False))  # as stored: tuples -> lists, int keys -> str


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
