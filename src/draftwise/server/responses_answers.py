"""Engine events -> OpenAI's Responses answers, beside answers.py's chat ones: the response object
(output items: an assistant message of output_text, function_call items; usage in Responses'
words, with draftwise's speculation metrics as usage.speculative) and its server-sent events
(response.created ... response.completed, each with its sequence_number), which
streams.responses_reply carries. Tool calls are read as on /v1/chat/completions (tools.py).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from draftwise.server import answers
from draftwise.server.responses_protocol import ResponsesRequest, split_name
from draftwise.server.responses_translate import ResponsesReply, responses_reply
from draftwise.server.serving import Finished, Piece
from draftwise.server.tools import ChatTools
from draftwise.tools import StreamEvent


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def response_usage(done: Finished) -> dict[str, Any]:
    """usage of a response: chat's counts under Responses' names, plus `speculative`."""
    u = answers.usage(done)
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.prompt_tokens_details.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.total_tokens,
        "speculative": u.speculative.model_dump(),
    }


def message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "type": "message",
        "id": item_id or new_id("msg"),
        "status": status,
        "role": "assistant",
        "content": content if status != "in_progress" else [],
    }


def call_item(
    call_id: str, name: str, arguments: str, status: str = "completed", namespaces: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """A function_call item; a call of a namespace's function names its namespace apart."""
    short, namespace = split_name(name, namespaces)
    item = {
        "type": "function_call",
        "id": "fc_" + call_id.removeprefix("call_"),
        "call_id": call_id,
        "name": short,
        "arguments": arguments,
        "status": status,
    }
    if namespace:
        item["namespace"] = namespace
    return item


class ResponseAnswer:
    """One /v1/responses answer: the response object, or its events as the job's events come."""

    def __init__(
        self,
        reply: ResponsesReply | ResponsesRequest,
        model_name: str,
        tools: ChatTools | None,
        previous_response_id: str | None,
    ) -> None:
        """reply: how the request is answered (responses_translate.translate's; a body given in
        its place is read as that would read it)."""
        self.reply = reply if isinstance(reply, ResponsesReply) else responses_reply(reply)
        self.model_name, self.tools = model_name, tools
        self.id, self.created_at = new_id("resp"), int(time.time())
        self.previous_response_id = previous_response_id
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # the items streamed so far
        self.text: dict[int, str] = {}  # streamed text per message item (by output index)
        self.open: int | None = None  # the output index of the item being streamed
        self.namespaces = self.reply.namespaces

    # ------------------------------------------------------------------ objects
    def response(self, status: str, output: list[dict], done: Finished | None = None) -> dict[str, Any]:
        reply = self.reply
        out = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": reply.instructions,
            "max_output_tokens": reply.max_output_tokens,
            "model": self.model_name,
            "output": output,
            "parallel_tool_calls": reply.parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": reply.store,
            "temperature": reply.temperature,
            "text": {"format": reply.text_format},
            "tool_choice": reply.tool_choice,
            "tools": reply.tools,
            "top_p": reply.top_p,
            "truncation": reply.truncation,
            "usage": response_usage(done) if done is not None else None,
            "metadata": reply.metadata,
            "user": reply.user,
        }
        if done is not None:
            out["completed_at"] = int(time.time())
        return out

    def whole(self, done: Finished) -> dict[str, Any]:
        text, status = done.result.text, _status(done)
        output: list[dict[str, Any]] = []
        if self.tools is None:
            output.append(message_item(text, status))
        else:
            parsed = self.tools.parse(text)
            if parsed.content or not parsed.calls:
                output.append(message_item(parsed.content or "", status))
            output += [call_item(c.id, c.name, c.arguments, namespaces=self.namespaces) for c in parsed.calls]
        return self.response(status, output, done)

    # ------------------------------------------------------------------ events
    def _event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def openings(self) -> list[str]:
        started = self.response("in_progress", [])
        return [
            self._event("response.created", response=started),
            self._event("response.in_progress", response=started),
        ]

    def _close(self, status: str = "completed") -> list[str]:
        """The events that end the item being streamed."""
        if self.open is None:
            return []
        index, item, out = self.open, self.output[self.open], []
        self.open = None
        if item["type"] == "message":
            text = self.text[index]
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append(self._event("response.output_text.done", **where, text=text, logprobs=[]))
            out.append(self._event("response.content_part.done", **where, part=part))
            item = message_item(text, status, item["id"])
        else:
            arguments = item["arguments"]
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=arguments,
                )
            )
            item = {**item, "status": "completed"}
        self.output[index] = item
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        return out

    def _text(self, delta: str) -> list[str]:
        out = []
        if self.open is None or self.output[self.open]["type"] != "message":
            out += self._close()
            self.open = len(self.output)
            item = message_item("", "in_progress")
            self.output.append(item)
            self.text[self.open] = ""
            where = {"item_id": item["id"], "output_index": self.open, "content_index": 0}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self._event("response.output_item.added", output_index=self.open, item=item))
            out.append(self._event("response.content_part.added", **where, part=part))
        if delta:
            self.text[self.open] += delta
            item_id = self.output[self.open]["id"]
            out.append(
                self._event(
                    "response.output_text.delta",
                    item_id=item_id,
                    output_index=self.open,
                    content_index=0,
                    delta=delta,
                    logprobs=[],
                )
            )
        return out

    def _calls(self, events: list[StreamEvent]) -> list[str]:
        out = []
        for e in events:
            if e.content:
                out += self._text(e.content)
            elif e.name is not None:
                out += self._close()
                self.open = len(self.output)
                item = call_item(e.id, e.name, "", "in_progress", self.namespaces)
                self.output.append(item)
                out.append(self._event("response.output_item.added", output_index=self.open, item=item))
            elif e.arguments and self.open is not None:
                item = self.output[self.open]
                item["arguments"] += e.arguments
                out.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=self.open,
                        delta=e.arguments,
                    )
                )
        return out

    def piece(self, piece: Piece) -> list[str]:
        if self.tools is None:
            return self._text(piece.text)
        return self._calls(self.tools.feed(0, piece.text))

    def last(self, done: Finished) -> tuple[list[str], dict[str, Any]]:
        """The closing events and the finished response object."""
        out = [] if self.tools is None else self._calls(self.tools.finish(0)[0])
        if not self.output:  # an empty answer is still one message
            out += self._text("")
        status = _status(done)
        out += self._close(status)
        final = self.response(status, self.output, done)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        out.append(self._event(kind, response=final))
        return out, final

    def failed(self, message: str, code: str | None, param: str | None) -> list[str]:
        error = self._event("error", code=code, message=message, param=param)
        response = {
            **self.response("failed", self.output),
            "error": {"code": code or "server_error", "message": message},
        }
        return [error, self._event("response.failed", response=response)]


def _status(done: Finished) -> str:
    return "incomplete" if done.result.finish_reason == "length" else "completed"
