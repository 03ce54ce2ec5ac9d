"""Engine events -> Anthropic's Messages answers, beside answers.py's OpenAI ones: the whole
`message` object (text and tool_use content blocks, stop_reason, usage) and its server-sent
events (message_start, content_block_start / _delta / _stop, message_delta, message_stop).

usage follows Anthropic: input_tokens are the prompt tokens the cache did not hold and
cache_read_input_tokens those it did; draftwise's speculation metrics ride beside them in
usage.speculative (the SDKs keep unknown fields), as usage.speculative does on /v1/chat/completions.
"""

from __future__ import annotations

import json
from typing import Any

from draftwise.server import answers
from draftwise.server.serving import Finished, Job, Piece
from draftwise.server.tools import ChatTools
from draftwise.tools import StreamEvent


def event(kind: str, data: dict) -> str:
    """One server-sent event named as Anthropic names it (the data repeats the name as "type")."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


# Anthropic's error type for each status (its API's errors page); 529 is its "overloaded".
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def error(status: int, message: str) -> tuple[int, dict]:
    """(status, body) of an error in Anthropic's shape; a full queue or a shutdown (503 on the
    OpenAI routes) is Anthropic's 529 overloaded_error, which its SDKs retry.
    Example: (404, "model: 'x' does not exist") -> (404, {"type": "error", "error": {"type":
    "not_found_error", "message": "model: 'x' does not exist"}})."""
    status = 529 if status == 503 else status
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return status, {"type": "error", "error": {"type": kind, "message": message}}


def usage(done: Finished) -> dict[str, Any]:
    openai = answers.usage(done)
    cached = openai.prompt_tokens_details.cached_tokens if openai.prompt_tokens_details else 0
    return {
        "input_tokens": openai.prompt_tokens - cached,
        "output_tokens": openai.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "speculative": openai.speculative.model_dump(),
    }


def stop_reason(done: Finished, stop: tuple[str, ...], tokenizer, called: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): max_tokens, tool_use (the answer ended with calls),
    stop_sequence (with the one matched), else end_turn."""
    result = done.result
    if result.finish_reason == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    if stop and not result.stats.num_eos:
        # The generated tokens run past the cut text into the stop sequence that ended it.
        tail = tokenizer.decode(result.token_ids)[len(result.text) :]
        matched = next((s for s in stop if tail.startswith(s)), None)
        if matched is not None or len(stop) == 1:
            return "stop_sequence", matched or stop[0]
    return "end_turn", None


class MessagesAnswer:
    """One /v1/messages answer: its events as the job's come (`opening`, `piece`, `last`), or the
    whole message. With tools, the text becomes tool_use blocks (streamed as input_json_delta)."""

    def __init__(self, job: Job, model_name: str, tokenizer, tools: ChatTools | None, stop: tuple[str, ...]) -> None:
        self.id = job.id
        self.num_prompt = len(job.prompt_ids)
        self.model_name, self.tokenizer, self.tools, self.stop = model_name, tokenizer, tools, stop
        self._open: int | None = None  # the index of the block being streamed
        self._kind = ""  # its type
        self._sent = ""  # the text streamed so far
        self._blocks = 0

    def _message(self, content: list[dict], reason: str | None, sequence: str | None, use: dict) -> dict:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model_name,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": use,
        }

    def whole(self, done: Finished) -> dict:
        text, content = done.result.text, []
        parsed = self.tools.parse(text) if self.tools is not None else None
        if parsed is not None and parsed.calls:
            if parsed.content:
                content.append({"type": "text", "text": parsed.content})
            for call in parsed.calls:
                content.append(
                    {"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments)}
                )
        elif text:
            content.append({"type": "text", "text": text})
        reason, sequence = stop_reason(done, self.stop, self.tokenizer, bool(parsed and parsed.calls))
        return self._message(content, reason, sequence, usage(done))

    # ------------------------------------------------------------------ streamed
    def opening(self) -> str:
        start = {"input_tokens": self.num_prompt, "output_tokens": 0}
        return event("message_start", {"message": self._message([], None, None, start)})

    def piece(self, piece: Piece) -> str:
        if self.tools is None:
            return self._deltas([StreamEvent(content=piece.text)])
        return self._deltas(self.tools.feed(0, piece.text))

    def last(self, done: Finished) -> str:
        out, called = "", False
        if self.tools is not None:
            held, called = self.tools.finish(0)
            out = self._deltas(held)
            text = done.result.text
            if not called and text.startswith(self._sent) and len(text) > len(self._sent):
                # a call the answer's end cut short is text, as the whole message holds it
                out += self._deltas([StreamEvent(content=text[len(self._sent) :])])
        out += self._close()
        reason, sequence = stop_reason(done, self.stop, self.tokenizer, called)
        delta = {"delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage(done)}
        return out + event("message_delta", delta) + event("message_stop", {})

    def _deltas(self, events: list[StreamEvent]) -> str:
        """Blocks for parser events: text deltas into a text block, each call a tool_use block."""
        out = []
        for e in events:
            if e.content:
                if self._kind != "text":
                    out.append(self._close())
                    out.append(self._start({"type": "text", "text": ""}))
                out.append(self._delta({"type": "text_delta", "text": e.content}))
                self._sent += e.content
            elif e.name is not None:
                out.append(self._close())
                out.append(self._start({"type": "tool_use", "id": e.id, "name": e.name, "input": {}}))
            elif e.arguments:
                out.append(self._delta({"type": "input_json_delta", "partial_json": e.arguments}))
        return "".join(out)

    def _start(self, block: dict) -> str:
        self._open, self._kind, self._blocks = self._blocks, block["type"], self._blocks + 1
        return event("content_block_start", {"index": self._open, "content_block": block})

    def _delta(self, delta: dict) -> str:
        return event("content_block_delta", {"index": self._open, "delta": delta})

    def _close(self) -> str:
        if self._open is None:
            return ""
        index, self._open, self._kind = self._open, None, ""
        return event("content_block_stop", {"index": index})
