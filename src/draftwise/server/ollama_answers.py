"""Engine events -> Ollama's answers, beside answers.py's OpenAI and llama.cpp ones: the
/api/chat and /api/generate chunks (NDJSON lines, streams.ollama_reply carries them), the final
object with its counts and nanosecond durations (plus draftwise's speculation metrics under
"speculative", which Ollama clients ignore), tool calls in Ollama's shape, and the model
descriptions of /api/tags, /api/show and /api/ps.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, Protocol

from draftwise.models import REGISTRY
from draftwise.server import answers, choices
from draftwise.server import ollama_protocol as o
from draftwise.server.ollama_protocol import tagged
from draftwise.server.serving import Finished, Piece
from draftwise.server.state import ServerState
from draftwise.server.tools import ChatTools
from draftwise.tools import ToolCall, format_for

# The Ollama release whose API (docs/api.md) these routes follow; clients gate features on it.
OLLAMA_VERSION = "0.33.0"
# model_info's keys are "<architecture>.<field>"; clients read "<architecture>.context_length".
ARCHITECTURE = "draftwise"


# The latest moment a timestamp says (Go's and Python's calendars end with year 9999).
LAST_MOMENT = 253402300799.0


def timestamp(at: float | None = None) -> str:
    """RFC 3339 in UTC, as Go writes time.Time, at most the last second of year 9999.
    Example: "2026-12-02T23:21:08.123456Z"."""
    at = time.time() if at is None else at
    moment = datetime.fromtimestamp(min(max(at, 0.0), LAST_MOMENT), timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def line(obj: dict) -> str:
    """One NDJSON line."""
    return json.dumps(obj, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------- chunks
def chat_chunk(
    model: str, content: str = "", tool_calls: list[dict] | None = None, logprobs: list[dict] | None = None
) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    out: dict[str, Any] = {"model": model, "created_at": timestamp(), "message": message, "done": False}
    if logprobs:
        out["logprobs"] = logprobs
    return out


def generate_chunk(model: str, response: str = "", logprobs: list[dict] | None = None) -> dict:
    out: dict[str, Any] = {"model": model, "created_at": timestamp(), "response": response, "done": False}
    if logprobs:
        out["logprobs"] = logprobs
    return out


def logprobs(tokenizer, entries: Sequence) -> list[dict] | None:
    """Ollama's logprobs: [{token, logprob, bytes, top_logprobs: [...]}] (OpenAI's chat entries)."""
    return choices.chat_logprobs(tokenizer, entries)["content"] if entries else None


def finished(chunk: dict, done: Finished, started: float) -> dict:
    """The final object: chunk (its message or response) with done, done_reason, the counts and
    durations (ns; total_duration from `started`, a time.monotonic()), and `speculative`.

    NOTE: speculative is the request's metrics as /v1's usage.speculative tells them; when the slot
    last served another tenant it holds no cache figures, and so the durations that would show how
    much of that tenant's prompt this request reused (prompt_eval, eval, total) are left out."""
    stats = done.result.stats
    out = {
        **chunk,
        "done": True,
        "done_reason": stats.finish_reason if stats.finish_reason in ("stop", "length") else "stop",
        "load_duration": 0,  # the model loaded when the server started
        "prompt_eval_count": stats.num_prompt_tokens,
        "eval_count": stats.num_generated,
    }
    if done.cache_visible:
        out["total_duration"] = round((time.monotonic() - started) * 1e9)
        out["prompt_eval_duration"] = round(stats.prefill_ms * 1e6)
        out["eval_duration"] = round(stats.decode_ms * 1e6)
    out["speculative"] = answers.usage(done).speculative.model_dump()
    return out


def loaded(model: str, chat: bool, reason: str = "load") -> dict:
    """The answer to an empty prompt or chat: Ollama's "load the model" request."""
    body = chat_chunk(model) if chat else generate_chunk(model)
    return {**body, "done": True, "done_reason": reason}


# ---------------------------------------------------------------------- tool calls
def ollama_call(call: ToolCall, index: int) -> dict:
    """A parsed call in Ollama's shape: arguments as a JSON object, not a JSON text.
    Example: ToolCall("call_1", "f", '{"x": 1}'), 0 -> {"id": "call_1", "function": {"index": 0,
    "name": "f", "arguments": {"x": 1}}}."""
    return {"id": call.id, "function": {"index": index, "name": call.name, "arguments": json.loads(call.arguments)}}


# ---------------------------------------------------------------------- answers
class OllamaAnswer(Protocol):
    """One /api/chat or /api/generate request's answer: chunks as its job's events come, or the
    whole final object."""

    def piece(self, event: Piece) -> list[dict]: ...
    def last(self, done: Finished) -> list[dict]: ...
    def whole(self, done: Finished) -> dict: ...


class GenerateAnswer:
    """/api/generate: `response` text chunks, then the final object."""

    def __init__(self, model: str, tokenizer, started: float) -> None:
        self.model, self.tokenizer, self.started = model, tokenizer, started

    def piece(self, event: Piece) -> list[dict]:
        return [generate_chunk(self.model, event.text, logprobs(self.tokenizer, event.logprobs))]

    def last(self, done: Finished) -> list[dict]:
        return [finished(generate_chunk(self.model), done, self.started)]

    def whole(self, done: Finished) -> dict:
        chunk = generate_chunk(self.model, done.result.text, logprobs(self.tokenizer, done.result.logprobs or ()))
        return finished(chunk, done, self.started)


class ChatAnswer:
    """/api/chat: message chunks, then the final object. With tools, the text a call's parser holds
    back is never content, and the calls come whole in one chunk before the final object (as the
    whole answer holds them: an answer cut inside a call has none, its text is content)."""

    def __init__(self, model: str, tokenizer, started: float, tools: ChatTools | None) -> None:
        self.model, self.tokenizer, self.started, self.tools = model, tokenizer, started, tools
        self._sent: list[str] = []  # the content streamed so far (with tools)

    def piece(self, event: Piece) -> list[dict]:
        if self.tools is None:
            return [chat_chunk(self.model, event.text, logprobs=logprobs(self.tokenizer, event.logprobs))]
        return self._content(self.tools.feed(0, event.text))

    def last(self, done: Finished) -> list[dict]:
        out = []
        if self.tools is not None:
            out = self._content(self.tools.finish(0)[0])
            text, calls = self._parsed(done.result.text)
            so_far = "".join(self._sent)
            if calls:
                out.append(chat_chunk(self.model, "", calls))
            elif text.startswith(so_far) and len(text) > len(so_far):
                out.append(chat_chunk(self.model, text[len(so_far) :]))
        return [*out, finished(chat_chunk(self.model), done, self.started)]

    def whole(self, done: Finished) -> dict:
        text, calls = self._parsed(done.result.text)
        chunk = chat_chunk(self.model, text, calls, logprobs(self.tokenizer, done.result.logprobs or ()))
        return finished(chunk, done, self.started)

    def _content(self, events) -> list[dict]:
        texts = [e.content for e in events if e.content]
        self._sent.extend(texts)
        return [chat_chunk(self.model, text) for text in texts]

    def _parsed(self, text: str) -> tuple[str, list[dict] | None]:
        """A whole answer's content and its calls in Ollama's shape (None without calls)."""
        parsed = self.tools.parse(text) if self.tools is not None else None
        if parsed is None or not parsed.calls:
            return text, None
        return parsed.content or "", [ollama_call(call, i) for i, call in enumerate(parsed.calls)]


# ---------------------------------------------------------------------- models
def _size_and_digest(state: ServerState) -> tuple[int, str]:
    """A registry model's file size and SHA-256; another's size is unknown (0) and its digest the
    SHA-256 of the target's identity (stable while the file is unchanged)."""
    spec = REGISTRY.get(state.model_name)
    if spec is not None:
        return spec.size, spec.sha256
    return 0, hashlib.sha256(state.engine.target.identity.encode()).hexdigest()


def details(state: ServerState) -> o.ModelDetails:
    gguf = state.model_name.endswith(".gguf") or state.model_name in REGISTRY
    return o.ModelDetails(
        format="gguf" if gguf else "", family="", families=[], parameter_size="", quantization_level=""
    )


def capabilities(state: ServerState) -> list[str]:
    """Ollama's capability names: completion, tools (the chat template knows a call format this
    server parses), insert (the model has FIM tokens, so /api/generate takes a suffix)."""
    out = ["completion"]
    if format_for(state.engine.tokenizer.chat_template) is not None:
        out.append("tools")
    if state.fim_tokens is not None:
        out.append("insert")
    return out


def listed(state: ServerState) -> o.ListedModel:
    name, (size, digest) = tagged(state.model_name), _size_and_digest(state)
    return o.ListedModel(
        name=name, model=name, modified_at=timestamp(state.created), size=size, digest=digest, details=details(state)
    )


def running(state: ServerState) -> o.RunningModel:
    name, (size, digest) = tagged(state.model_name), _size_and_digest(state)
    return o.RunningModel(
        name=name,
        model=name,
        size=size,
        digest=digest,
        details=details(state),
        expires_at=timestamp(time.time() + 10 * 365 * 24 * 3600),  # it stays loaded while the server runs
        size_vram=0,
        context_length=state.engine.target.n_ctx,
    )


def show(state: ServerState) -> o.ShowResponse:
    n_ctx = state.engine.target.n_ctx
    return o.ShowResponse(
        modelfile=f"# draftwise serves this model; it has no Modelfile\nFROM {tagged(state.model_name)}\n",
        parameters=f"num_ctx {n_ctx}",
        template=state.engine.tokenizer.chat_template or "",
        details=details(state),
        model_info={
            "general.architecture": ARCHITECTURE,
            "general.name": state.model_name,
            f"{ARCHITECTURE}.context_length": n_ctx,
            f"{ARCHITECTURE}.vocab_size": state.engine.target.vocab_size,
        },
        capabilities=capabilities(state),
        modified_at=timestamp(state.created),
    )


def pull_statuses(state: ServerState) -> list[dict]:
    """What Ollama streams for a pull of a model it already holds."""
    size, digest = _size_and_digest(state)
    return [
        {"status": "pulling manifest"},
        {"status": f"pulling {digest[:12]}", "digest": f"sha256:{digest}", "total": size, "completed": size},
        {"status": "verifying sha256 digest"},
        {"status": "writing manifest"},
        {"status": "success"},
    ]
