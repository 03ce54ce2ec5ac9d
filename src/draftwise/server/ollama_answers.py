"""Engine results and stream events -> Ollama's objects: the /api/chat and /api/generate chunks
(NDJSON lines), the final object with its counts and nanosecond durations (plus draftwise's
speculation metrics under "speculative", which Ollama clients ignore), tool calls in Ollama's
shape, and the model descriptions of /api/tags, /api/show and /api/ps.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from draftwise.fim import fim_tokens
from draftwise.models import REGISTRY
from draftwise.server import choices
from draftwise.server import ollama_protocol as o
from draftwise.server.ollama_requests import tagged
from draftwise.server.serving import Finished
from draftwise.tools import ToolCall, format_for

# The Ollama release whose API (docs/api.md) these routes follow; clients gate features on it.
OLLAMA_VERSION = "0.33.0"
# model_info's keys are "<architecture>.<field>"; clients read "<architecture>.context_length".
ARCHITECTURE = "draftwise"


def timestamp(at: float | None = None) -> str:
    """RFC 3339 in UTC, as Go writes time.Time. Example: "2026-12-02T23:21:08.123456Z"."""
    moment = datetime.fromtimestamp(time.time() if at is None else at, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def line(obj: Any) -> str:
    """One NDJSON line."""
    if isinstance(obj, o.BaseModel):
        obj = obj.model_dump(mode="json")
    return json.dumps(obj, ensure_ascii=False) + "\n"


def error_line(message: str) -> str:
    """A failure after the stream began: Ollama's clients raise it as their ResponseError."""
    return line({"error": message})


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


def finished(chunk: dict, done: Finished, started: float, speculative: dict) -> dict:
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
    out["speculative"] = speculative
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


# ---------------------------------------------------------------------- models
class ServedModel:
    """What /api/tags, /api/show and /api/ps say of the served model."""

    def __init__(self, engine, name: str, started_at: float) -> None:
        self.engine, self.name, self.started_at = engine, name, started_at
        spec = REGISTRY.get(name)
        self.size = spec.size if spec else 0
        self.digest = spec.sha256 if spec else hashlib.sha256(engine.target.identity.encode()).hexdigest()

    def details(self) -> o.ModelDetails:
        gguf = self.name.endswith(".gguf") or self.name in REGISTRY
        return o.ModelDetails(
            format="gguf" if gguf else "", family="", families=[], parameter_size="", quantization_level=""
        )

    def capabilities(self) -> list[str]:
        tokenizer = self.engine.tokenizer
        out = ["completion"]
        if format_for(tokenizer.chat_template) is not None:
            out.append("tools")
        if fim_tokens(tokenizer) is not None:
            out.append("insert")
        return out

    def listed(self) -> o.ListedModel:
        name = tagged(self.name)
        return o.ListedModel(
            name=name,
            model=name,
            modified_at=timestamp(self.started_at),
            size=self.size,
            digest=self.digest,
            details=self.details(),
        )

    def running(self) -> o.RunningModel:
        name = tagged(self.name)
        return o.RunningModel(
            name=name,
            model=name,
            size=self.size,
            digest=self.digest,
            details=self.details(),
            expires_at=timestamp(time.time() + 10 * 365 * 24 * 3600),  # it stays loaded while the server runs
            size_vram=0,
            context_length=self.engine.target.n_ctx,
        )

    def show(self) -> o.ShowResponse:
        n_ctx = self.engine.target.n_ctx
        return o.ShowResponse(
            modelfile=f"# draftwise serves this model; it has no Modelfile\nFROM {tagged(self.name)}\n",
            parameters=f"num_ctx {n_ctx}",
            template=self.engine.tokenizer.chat_template or "",
            details=self.details(),
            model_info={
                "general.architecture": ARCHITECTURE,
                "general.name": self.name,
                f"{ARCHITECTURE}.context_length": n_ctx,
                f"{ARCHITECTURE}.vocab_size": self.engine.target.vocab_size,
            },
            capabilities=self.capabilities(),
            modified_at=timestamp(self.started_at),
        )
