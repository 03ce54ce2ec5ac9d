"""What the fuzz (test_fuzz.py) sends and how it judges the answers: a valid base request per
JSON route, the raw JSON values no schema can type (non-finite numbers, integers beyond 64 bits,
lone surrogates) placed at each field of a base, and each protocol's error shape.

Values are written as raw JSON text: Python's json module cannot write 1e400 or a lone
surrogate's escape "\\ud800", and those are what a client can send. Example:
`raw_body({"a": [1]}, ("a", 0), "1e400") == b'{"a": [1e400]}'`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from tests.server.conftest import MODEL

SURROGATE = '"\\ud800x"'  # a JSON string holding a lone surrogate, as a JSON escape
# Raw JSON values that a schema's "number", "integer" or "string" cannot rule out, by name,
# and values of every JSON type (the wrong one for most fields).
RAW_VALUES = {
    "1e400": "1e400",
    "-1e400": "-1e400",
    "NaN": "NaN",
    "Infinity": "Infinity",
    "2**63": str(2**63),
    "-2**63-1": str(-(2**63) - 1),
    "5000digits": "9" * 5000,  # beyond Python's int-from-text limit (4300 digits)
    "surrogate": SURROGATE,
    "true": "true",
    "text": '"x"',
    "list": "[1]",
    "object": '{"a": null}',
}

_SLOT = "\x00fuzz\x00"  # stands where the raw value goes; json.dumps writes it as below
_SLOT_JSON = json.dumps(_SLOT)


@dataclass(frozen=True)
class Probe:
    """A valid request to one route, named for the test ids ("chat", "chat-stream")."""

    name: str
    path: str
    body: dict[str, Any]

    @property
    def streamed(self) -> bool:
        return self.body.get("stream") is True or (self.path.startswith("/api/") and self.body.get("stream") is None)


Path = tuple[str | int, ...]

_SPECULATION = {"policy": "fixed", "max_draft_tokens": 2, "drafters": ["ngram"], "enabled": True}
_SAMPLING = {  # the OpenAI routes' sampling fields, each at a valid value
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 5,
    "min_p": 0.01,
    "seed": 7,
    "stop": ["zz"],
    "n": 1,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.1,
    "repeat_penalty": 1.1,
    "repeat_last_n": 8,
    "logit_bias": {"5": 1.5},
    "user": "u",
    "speculation": _SPECULATION,
}
_DIGIT = {"type": "integer", "minimum": 0, "maximum": 9}
_OLLAMA_OPTIONS = {
    "num_predict": 2,
    "num_ctx": 64,
    "temperature": 0.5,
    "top_k": 5,
    "top_p": 0.9,
    "min_p": 0.01,
    "seed": 3,
    "repeat_penalty": 1.1,
    "repeat_last_n": 8,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.1,
    "stop": ["zz"],
}
_CHAT = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "u"},
    ],
    "max_tokens": 2,
    "max_completion_tokens": 2,
    "logprobs": True,
    "top_logprobs": 1,
    "prediction": {"type": "content", "content": "hello"},
    **_SAMPLING,
}
_RESPONSES = {
    "model": MODEL,
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
    "instructions": "be brief",
    "max_output_tokens": 2,
    "temperature": 0.7,
    "top_p": 0.9,
    "metadata": {"k": "v"},
    "user": "u",
    "store": False,
    "text": {"format": {"type": "json_schema", "name": "digit", "schema": _DIGIT}},
    "speculation": _SPECULATION,
}
_MESSAGES = {
    "model": MODEL,
    "max_tokens": 2,
    "system": [{"type": "text", "text": "be brief"}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
    "stop_sequences": ["zz"],
    "metadata": {"user_id": "u"},
    "speculation": _SPECULATION,
}
_OLLAMA_CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hi"}],
    "stream": False,
    "options": _OLLAMA_OPTIONS,
    "format": _DIGIT,
    "keep_alive": "5m",
    "logprobs": True,
    "top_logprobs": 1,
}
_INFILL = {
    "input_prefix": "ab",
    "input_suffix": "cd",
    "input_extra": [{"text": "x", "filename": "f"}],
    "prompt": "a",
    "n_predict": 2,
    "temperature": 0.5,
    "top_k": 5,
    "top_p": 0.9,
    "min_p": 0.05,
    "seed": 1,
    "stop": ["zz"],
    "samplers": ["top_k", "top_p", "min_p", "temperature"],
    "repeat_penalty": 1.1,
    "repeat_last_n": 8,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.1,
    "logit_bias": [[5, 1.0]],
    "n_cmpl": 1,
}

PROBES = (
    Probe(
        "chat",
        "/v1/chat/completions",
        {**_CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "digit", "schema": _DIGIT}}},
    ),
    Probe("chat-stream", "/v1/chat/completions", {**_CHAT, "stream": True, "stream_options": {"include_usage": True}}),
    Probe(
        "completions",
        "/v1/completions",
        {"model": MODEL, "prompt": "ab", "max_tokens": 2, "logprobs": 1, "echo": False, "best_of": 1, **_SAMPLING},
    ),
    Probe(
        "completions-ids", "/v1/completions", {"model": MODEL, "prompt": [[1, 2, 3]], "max_tokens": 2, "stream": True}
    ),
    Probe("responses", "/v1/responses", _RESPONSES),
    Probe("responses-stream", "/v1/responses", {**_RESPONSES, "text": {"format": {"type": "text"}}, "stream": True}),
    Probe("messages", "/v1/messages", _MESSAGES),
    Probe("messages-stream", "/v1/messages", {**_MESSAGES, "stream": True}),
    Probe(
        "count_tokens", "/v1/messages/count_tokens", {"model": MODEL, "system": "x", "messages": _MESSAGES["messages"]}
    ),
    Probe("ollama-chat", "/api/chat", _OLLAMA_CHAT),
    Probe("ollama-chat-stream", "/api/chat", {**_OLLAMA_CHAT, "stream": True}),
    Probe(
        "ollama-generate",
        "/api/generate",
        {
            "model": MODEL,
            "prompt": "hi",
            "system": "be brief",
            "stream": False,
            "options": _OLLAMA_OPTIONS,
            "format": _DIGIT,
        },
    ),
    Probe(
        "ollama-generate-raw",
        "/api/generate",
        {"model": MODEL, "prompt": "hi", "raw": True, "options": {"num_predict": 2}},
    ),
    Probe("ollama-show", "/api/show", {"model": MODEL, "name": MODEL, "verbose": False}),
    Probe("ollama-pull", "/api/pull", {"model": MODEL, "name": MODEL, "stream": False}),
    Probe("infill", "/infill", _INFILL),
    Probe("infill-stream", "/infill", {**_INFILL, "stream": True}),
    Probe("tokenize", "/tokenize", {"content": "hi", "prompt": "hi", "add_special": False, "with_pieces": True}),
    Probe("detokenize", "/detokenize", {"tokens": [1, 2, 3]}),
)


# ---------------------------------------------------------------------- raw JSON bodies
def paths(value: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every value's path under value (the root excluded), depth first.
    Example: {"a": [1]} -> ("a",), ("a", 0)."""
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield (*prefix, key)
        yield from paths(child, (*prefix, key))


def key_paths(value: Any) -> Iterator[Path]:
    """The paths of every object member (a key a client could spell with a lone surrogate)."""
    return (path for path in paths(value) if isinstance(path[-1], str))


def _with_slot(value: Any, path: Path, *, key: bool) -> Any:
    """value with _SLOT at path (key: as the member's key, its value kept)."""
    if len(path) == 1 and key:
        return {(_SLOT if k == path[0] else k): v for k, v in value.items()}
    if len(path) == 1:
        copy = dict(value) if isinstance(value, dict) else list(value)
        copy[path[0]] = _SLOT
        return copy
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _with_slot(value[path[0]], path[1:], key=key)
    return copy


def raw_body(base: dict[str, Any], path: Path, raw: str, *, key: bool = False) -> bytes:
    """base as JSON text with the raw JSON text `raw` at path (key: as the member's key)."""
    text = json.dumps(_with_slot(base, path, key=key))
    assert text.count(_SLOT_JSON) == 1, "the slot's text must not occur in a base request"
    return text.replace(_SLOT_JSON, raw).encode()


def case_id(path: Path) -> str:
    return ".".join(str(part) for part in path)


def lone_surrogate_string(before: str, surrogate: int, after: str) -> str:
    """A JSON string with a lone surrogate's escape between two texts.
    Example: ("a", 0xD800, "b") -> '"a\\ud800b"'."""
    return json.dumps(before)[:-1] + f"\\u{surrogate:04x}" + json.dumps(after)[1:]


def lone_surrogate_key(raw: str) -> str:
    """The raw value as a key: a string as it is, anything else as a string with a surrogate."""
    return raw if raw.startswith('"') else lone_surrogate_string(raw, 0xDC00, "")


# Hypothesis strategies for raw JSON values no schema can rule out: numbers beyond a float's or
# a 64-bit integer's range, NaN and infinities, strings with a lone surrogate somewhere.
RAW_JSON = st.one_of(
    st.sampled_from(["1e400", "-1e400", "1E+999", "-0.1e99999", "NaN", "Infinity", "-Infinity"]),
    st.integers(min_value=2**63).map(str),
    st.integers(max_value=-(2**63) - 1).map(str),
    st.builds(lone_surrogate_string, st.text(max_size=4), st.integers(0xD800, 0xDFFF), st.text(max_size=4)),
)


# ---------------------------------------------------------------------- judging answers
def protocol(path: str) -> str:
    """Whose error shape a route answers in: "ollama", "anthropic" or "openai"."""
    if path.startswith("/api/"):
        return "ollama"
    if path.startswith("/v1/messages"):
        return "anthropic"
    return "openai"


def error_shape_problem(path: str, body: bytes) -> str | None:
    """Why an error body is not in its route's protocol's shape, or None when it is:
    OpenAI's {"error": {"message", "type", ...}} (the /v1 routes and llama.cpp's), Ollama's
    {"error": "message"}, Anthropic's {"type": "error", "error": {"type", "message"}}."""
    try:
        data = strict_json(body)
    except ValueError as exc:
        return f"the error body is not JSON ({exc}): {body[:200]!r}"
    error = data.get("error") if isinstance(data, dict) else None
    kind = protocol(path)
    if kind == "ollama":
        ok = isinstance(error, str) and error != ""
    elif kind == "anthropic":
        ok = data.get("type") == "error" and isinstance(error, dict)
        ok = ok and isinstance(error.get("type"), str) and isinstance(error.get("message"), str)
    else:
        ok = isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("type"), str)
    return None if ok else f"not {kind}'s error shape: {body[:300]!r}"


_FAILED = b"generation failed: "  # the message of a job's unexpected failure (answers.failure)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(text: bytes | str) -> Any:
    """json.loads refusing NaN and Infinity, which strict parsers (JavaScript's JSON.parse) reject."""
    return json.loads(text, parse_constant=_no_constant)


def answer_problem(path: str, status: int, content_type: str, body: bytes) -> str | None:
    """Why an answer is wrong, or None: a 5xx; a 4xx not in the protocol's error shape; a 2xx
    that is not strict JSON (a JSON object, each server-sent event's data, each NDJSON line) or
    that carries a 5xx inside its stream (answers.failure's "generation failed")."""
    if status >= 500:
        return f"{status}: {body[:300]!r}"
    if status >= 400:
        return error_shape_problem(path, body)
    if not body:
        return f"{status} with an empty body"
    if _FAILED in body:
        return f"{status} whose stream ends in a server error: {body[max(0, body.index(_FAILED) - 100) :][:400]!r}"
    if "text/event-stream" in content_type:
        texts = [line[5:].strip() for line in body.decode().splitlines() if line.startswith("data:")]
        texts = [t for t in texts if t != "[DONE]"]
    elif "ndjson" in content_type:
        texts = [line for line in body.decode().splitlines() if line.strip()]
    elif "json" in content_type:
        texts = [body.decode()]
    else:
        return None  # text/plain: /metrics
    for text in texts:
        try:
            strict_json(text)
        except ValueError as exc:
            return f"{status} whose JSON is not strict ({exc}): {text[:300]!r}"
    return None
