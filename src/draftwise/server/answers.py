"""Engine events -> each protocol's answer: OpenAI's chunks and objects (chat, completions), and
llama.cpp's /infill answers (its partial and final objects, n_indent and t_max_predict_ms cuts).

An answer object is built per request and fed the events of its jobs (Piece, Finished,
JobFailed from serving.py) by index of choice; streams.py carries what it returns to the
client. Another API's answer (Ollama's, Responses', Messages') is one more such class.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Protocol

from draftwise.errors import ConstraintError
from draftwise.server import choices
from draftwise.server import protocol as p
from draftwise.server.errors import APIError
from draftwise.server.serving import Finished, Job, JobCancelled, JobFailed, Piece
from draftwise.server.tools import ChatTools, answer, deltas
from draftwise.server.translate import InfillReply, OpenAIReply
from draftwise.types import SamplingParams

SUPERSEDED = "superseded by a newer request from the same client"

# Figures that grow with the prompt work a cache saved: the target's prefill, and the draft
# model's catch-up at its first proposal (inside decode and draft time).
_CACHE_TIMINGS = ("prefill_ms", "decode_ms", "draft_ms", "tokens_per_second", "tokens_per_second_e2e")


class OpenAIAnswer(Protocol):
    """One /v1 request's answer: server-sent chunks as its jobs' events come, or the whole object."""

    def openings(self) -> list[str]: ...
    def text_chunk(self, index: int, piece: Piece) -> str: ...
    def final_chunk(self, index: int, done: Finished) -> str: ...
    def usage_chunk(self, usage: p.Usage) -> str: ...
    def whole(self, done: list[Finished]) -> Any: ...


# ---------------------------------------------------------------------- OpenAI: shared pieces
def usage(choices_done: Finished | list[Finished], n: int = 1) -> p.Usage:
    """Usage of one choice, or of several (prompt tokens once per prompt, completion tokens summed;
    usage.speculative is the first choice's)."""
    many = choices_done if isinstance(choices_done, list) else [choices_done]
    done = many[0]
    s = done.result.stats
    speculative = s.to_dict()
    if not done.cache_visible:
        # The slot last served another tenant: whatever it reused came from that tenant's request, so
        # neither the counts nor the times that would show it are told (null whether or not anything
        # was reused, so the nulls themselves say nothing of the other's prompt).
        speculative.update(num_reused_tokens=0, num_draft_reused_tokens=0, **dict.fromkeys(_CACHE_TIMINGS))
    details = None
    if done.predicted:
        accepted = s.accepted_by.get("prediction", 0)
        details = p.CompletionTokensDetails(
            accepted_prediction_tokens=accepted, rejected_prediction_tokens=s.drafted_by.get("prediction", 0) - accepted
        )
    prompt_tokens = sum(d.result.stats.num_prompt_tokens for d in many[::n])
    completion_tokens = sum(d.result.stats.num_generated for d in many)
    return p.Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=p.PromptTokensDetails(cached_tokens=speculative["num_reused_tokens"]),
        completion_tokens_details=details,
        speculative=p.SpeculativeUsage(**speculative),
    )


def request_timings(done: Finished) -> dict | None:
    """llama-server's timings of one choice (what `timings` carries on OpenAI answers), or None
    where its cache came from another tenant (the prompt's split into cached and read is theirs)."""
    stats = done.result.stats
    return _timings(stats, stats.num_generated + stats.num_eos) if done.cache_visible else None


def finish_reason(done: Finished) -> str | None:
    reason = done.result.finish_reason
    return reason if reason in ("stop", "length") else None


def failure(event: JobFailed, constraint_param: str | None = None) -> APIError:
    """The error a failed job answers: a constraint that could not be followed while decoding
    (a lexer or parser limit reached mid-answer) is the request's fault, 400 naming its field."""
    if isinstance(event.error, JobCancelled):
        return APIError(503, "the server is shutting down", type="server_error", code="unavailable")
    if isinstance(event.error, ConstraintError):
        return APIError(400, str(event.error), param=constraint_param, code="invalid_value")
    return APIError(500, f"generation failed: {event.error}", type="server_error")


def token_sources(spans) -> dict[str, Any]:
    """A choice's `token_sources` extension field (none when the request did not ask): the
    TokenSpans of its text as objects, logprob only where asked."""
    if not spans:
        return {}
    rows = []
    for s in spans:
        row = {"text": s.text, "source": s.source, "step": s.step, "drafted": s.drafted, "accepted": s.accepted}
        if s.logprob is not None:
            row["logprob"] = round(s.logprob, 6)
        rows.append(row)
    return {"token_sources": rows}


def _sse(chunk: Any, include_usage: bool) -> str:
    data = chunk.model_dump(mode="json")
    if data.get("timings") is None:
        data.pop("timings", None)
    for choice in data["choices"]:
        if "delta" in choice:  # OpenAI leaves unset delta fields out: {"content": "x"}, {}
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
    if not include_usage:
        data.pop("usage")
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


# ---------------------------------------------------------------------- OpenAI: chat
class ChatAnswer:
    """A /v1/chat/completions answer: chat.completion.chunk events or one chat.completion; with
    tools, the text becomes message.tool_calls (streamed as delta.tool_calls)."""

    def __init__(
        self, reply: OpenAIReply, jobs: list[Job], model_name: str, tokenizer, tools: ChatTools | None
    ) -> None:
        self.reply, self.id, self.model_name, self.tokenizer, self.tools = (
            reply,
            jobs[0].id,
            model_name,
            tokenizer,
            tools,
        )
        self.num_choices = len(jobs)
        self.created, self.include_usage = int(time.time()), reply.include_usage

    def _logprobs(self, entries) -> dict | None:
        return choices.chat_logprobs(self.tokenizer, entries) if self.reply.logprobs is not None else None

    def _chunk(
        self,
        index: int,
        delta: p.ChatDelta | None,
        finish: str | None = None,
        usage: p.Usage | None = None,
        entries=None,
        spans=(),
        timings: dict | None = None,
    ) -> str:
        parts = (
            []
            if delta is None
            else [
                p.ChatChunkChoice(
                    index=index, delta=delta, finish_reason=finish, logprobs=entries, **token_sources(spans)
                )
            ]
        )
        chunk = p.ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model_name, choices=parts, usage=usage, timings=timings
        )
        return _sse(chunk, self.include_usage)

    def _delta_chunk(self, index: int):
        return lambda delta: self._chunk(index, p.ChatDelta(**delta))

    def openings(self) -> list[str]:
        return [self._chunk(i, p.ChatDelta(role="assistant", content="")) for i in range(self.num_choices)]

    def text_chunk(self, index: int, piece: Piece) -> str:
        if self.tools is None:
            return self._chunk(
                index, p.ChatDelta(content=piece.text), entries=self._logprobs(piece.logprobs), spans=piece.spans
            )
        return deltas(self.tools.feed(index, piece.text), self._delta_chunk(index))

    def final_chunk(self, index: int, done: Finished) -> str:
        finish, timings = finish_reason(done), request_timings(done)
        if self.tools is None:
            return self._chunk(index, p.ChatDelta(), finish, timings=timings)
        held, called = self.tools.finish(index)
        last = self._chunk(
            index, p.ChatDelta(), "tool_calls" if called and finish == "stop" else finish, timings=timings
        )
        return deltas(held, self._delta_chunk(index)) + last

    def usage_chunk(self, usage: p.Usage) -> str:
        return self._chunk(0, None, usage=usage)

    def _message(self, done: Finished) -> tuple[p.AssistantMessage, str | None]:
        if self.tools is None:
            return p.AssistantMessage(content=done.result.text), finish_reason(done)
        fields, finish = answer(self.tools, done.result.text, finish_reason(done))
        return p.AssistantMessage(**fields), finish

    def whole(self, done: list[Finished]) -> p.ChatCompletion:
        parts = []
        for i, d in enumerate(done):
            message, finish = self._message(d)
            entries = self._logprobs(d.result.logprobs or [])
            parts.append(
                p.ChatChoice(
                    index=i, message=message, finish_reason=finish, logprobs=entries, **token_sources(d.result.spans)
                )
            )
        return p.ChatCompletion(
            id=self.id,
            created=self.created,
            model=self.model_name,
            usage=usage(done, self.reply.n),
            choices=parts,
            timings=request_timings(done[0]),
        )


# ---------------------------------------------------------------------- OpenAI: completions
class CompletionAnswer:
    """A /v1/completions answer: text_completion chunks or one object; echo puts the prompt (and
    its logprobs) first, best_of keeps the n best candidates."""

    def __init__(self, reply: OpenAIReply, jobs: list[Job], model_name: str, tokenizer) -> None:
        self.reply, self.jobs, self.model_name, self.tokenizer = reply, jobs, model_name, tokenizer
        self.n, self.best_of = reply.n, reply.best_of
        self.created, self.include_usage = int(time.time()), reply.include_usage
        self._echoed: set[int] = set()
        self._sent: dict[int, int] = {}  # text sent per choice (logprobs' text_offset)

    def _chunk(
        self,
        index: int,
        text: str | None,
        finish: str | None = None,
        usage: p.Usage | None = None,
        entries=None,
        spans=(),
        timings: dict | None = None,
    ) -> str:
        parts = (
            []
            if text is None
            else [
                p.CompletionChoice(
                    index=index, text=text, finish_reason=finish, logprobs=entries, **token_sources(spans)
                )
            ]
        )
        chunk = p.Completion(
            id=self.jobs[0].id, created=self.created, model=self.model_name, choices=parts, usage=usage, timings=timings
        )
        return _sse(chunk, self.include_usage)

    def _echo(self, index: int, prompt_logprobs) -> tuple[str, dict | None]:
        """The prompt's text and (if asked) logprobs, once, with a streamed choice's first
        text (the first prompt token has none)."""
        if not self.reply.echo or index in self._echoed:
            return "", None
        self._echoed.add(index)
        ids = self.jobs[index].prompt_ids
        entries = None
        if self.reply.logprobs is not None:
            rows = [None, *(prompt_logprobs or ())]
            entries = choices.completion_logprobs(self.tokenizer, rows, ids, self.reply.logprobs)
        return self.tokenizer.decode(ids), entries

    def openings(self) -> list[str]:
        return []

    def text_chunk(self, index: int, piece: Piece) -> str:
        prefix, head = self._echo(index, piece.prompt_logprobs)
        entries = None
        start = self._sent.get(index, 0) + len(prefix)  # text_offset counts from the choice's first text
        if self.reply.logprobs is not None:
            tokens = [e.token for e in piece.logprobs]
            entries = choices.completion_logprobs(
                self.tokenizer, piece.logprobs, tokens, self.reply.logprobs, offset=start
            )
        self._sent[index] = start + len(piece.text)
        return self._chunk(index, prefix + piece.text, entries=_joined(head, entries), spans=piece.spans)

    def final_chunk(self, index: int, done: Finished) -> str:
        prefix, head = self._echo(index, done.result.prompt_logprobs)  # an answer without text
        return self._chunk(index, prefix, finish_reason(done), entries=head, timings=request_timings(done))

    def usage_chunk(self, usage: p.Usage) -> str:
        return self._chunk(0, None, usage=usage)

    def _choice(self, index: int, done: Finished) -> p.CompletionChoice:
        result, entries = done.result, None
        prompt_text = self.tokenizer.decode(result.prompt_ids) if self.reply.echo else ""
        if self.reply.logprobs is not None:
            tokens = [e.token for e in result.logprobs or []]
            rows = list(result.logprobs or [])
            if self.reply.echo:  # the first prompt token has no logprob
                tokens = [*result.prompt_ids, *tokens]
                rows = [None, *(result.prompt_logprobs or []), *rows]
            entries = choices.completion_logprobs(self.tokenizer, rows, tokens, self.reply.logprobs)
        return p.CompletionChoice(
            index=index,
            text=prompt_text + result.text,
            finish_reason=finish_reason(done),
            logprobs=entries,
            **token_sources(result.spans),  # the generated text's (an echoed prompt has none)
        )

    def whole(self, done: list[Finished]) -> p.Completion:
        parts = [self._choice(i, d) for i, d in enumerate(choices.best(done, self.best_of, self.n))]
        return p.Completion(
            id=self.jobs[0].id,
            created=self.created,
            model=self.model_name,
            usage=usage(done, self.best_of),  # every candidate's tokens
            choices=parts,
            timings=request_timings(done[0]),
        )


def _joined(head: dict | None, tail: dict | None) -> dict | None:
    if head is None or tail is None:
        return head or tail
    return {key: head[key] + tail[key] for key in head}


# ---------------------------------------------------------------------- llama.cpp: /infill
def indent_cut(text: str, n_indent: int) -> int | None:
    """Where llama.cpp's n_indent rule ends an answer: at the first line after the first newline
    that has begun (a character after its indentation, a newline included) and is indented by
    fewer than n_indent spaces or tabs; the cut keeps that line's indentation. None: no cut.
    Example: ("x\\n    y\\n  z", 4) -> 12 (the text "x\\n    y\\n  ")."""
    if n_indent <= 0:
        return None
    newline = text.find("\n")
    while newline >= 0:
        pos = start = newline + 1
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and pos - start < n_indent:
            return pos
        newline = text.find("\n", start)
    return None


@dataclasses.dataclass
class _Completion:
    """What an /infill answer has to say about one job so far (the text after llama.cpp's cuts)."""

    job: Job
    text: str = ""
    sent: int = 0
    stop_type: str = "none"
    first_piece_at: float | None = None
    finished: Finished | None = None
    superseded: bool = False


class InfillAnswer:
    """An /infill answer, one completion per job: `advance` takes each event and says what new
    text to stream; `partial` and `final` are llama.cpp's objects (the final one with stop: true)."""

    def __init__(
        self, reply: InfillReply, jobs: list[Job], sampling: SamplingParams, *, model_name: str, n_ctx: int
    ) -> None:
        self.reply, self.model_name, self.room = reply, model_name, reply.room
        self.warmup = reply.warmup
        self.prompt_ids = jobs[0].prompt_ids
        self.completions = [_Completion(job) for job in jobs]
        self.settings = {
            "n_ctx": n_ctx,
            "n_predict": reply.n_predict,
            "model": model_name,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "min_p": sampling.min_p,
            "n_indent": reply.n_indent,
            "t_max_predict_ms": reply.t_max_predict_ms,
            "stop": list(sampling.stop),
            "samplers": reply.samplers,
        }

    def unfinished(self, reason: str) -> None:
        """Cancel the completions still running (a sibling failed, or the client left)."""
        for completion in self.completions:
            if completion.finished is None:
                completion.job.cancel(reason)

    def advance(self, index: int, event: Piece | Finished | JobFailed) -> str | None:
        """Take one event of completion `index`; returns new text to send (None: nothing new).
        Raises the APIError a failed job answers (a superseded one ends quietly)."""
        completion, job = self.completions[index], self.completions[index].job
        if isinstance(event, JobFailed):
            if isinstance(event.error, JobCancelled) and job.cancel_reason == SUPERSEDED:
                completion.superseded = True
                return None
            if isinstance(event.error, JobCancelled):
                raise APIError(503, "the server is shutting down", type="server_error", code="unavailable")
            raise APIError(500, f"generation failed: {event.error}", type="server_error")
        if isinstance(event, Finished):
            completion.finished = event
            completion.superseded = job.cancel_reason == SUPERSEDED
            if completion.stop_type == "none" and event.result.finish_reason != "cancelled":
                completion.stop_type = _stop_type(event)
            return None
        if self.warmup or completion.stop_type != "none":
            return None  # a warm-up has no answer; after a cut, the rest is dropped
        return self._take(completion, event.text)

    def _take(self, completion: _Completion, text: str) -> str:
        """Append a piece's text, cut where n_indent or t_max_predict_ms end the answer."""
        reply, now = self.reply, time.monotonic()
        completion.first_piece_at = completion.first_piece_at or now
        before = len(completion.text)
        completion.text += text
        cut = indent_cut(completion.text, reply.n_indent)
        newline = text.find("\n")
        if (
            reply.t_max_predict_ms
            and newline >= 0
            and 1000 * (now - completion.first_piece_at) > reply.t_max_predict_ms
            and (cut is None or before + newline + 1 < cut)
        ):
            cut = before + newline + 1  # llama.cpp: past the time limit, stop at a newline
        if cut is not None:
            completion.text, completion.stop_type = completion.text[:cut], "limit"
            completion.job.cancel("n_indent or t_max_predict_ms reached")
        new, completion.sent = completion.text[completion.sent :], len(completion.text)
        return new

    def partial(self, index: int, new: str) -> dict:
        return {
            "index": index,
            "content": new,
            "tokens": [],
            "stop": False,
            "id_slot": -1,
            "tokens_predicted": 0,
            "tokens_evaluated": len(self.prompt_ids),
        }

    def final(self, index: int, content: str | None = None) -> dict:
        """Completion `index`'s last object; content None: its whole text (a warm-up has none)."""
        reply, completion = self.reply, self.completions[index]
        if content is None:
            content = "" if self.warmup else completion.text
        done = completion.finished
        stats = done.result.stats if done is not None else None
        visible = done is not None and done.cache_visible
        out = {
            "index": index,
            "content": content,
            "tokens": [],
            "id_slot": -1,
            "stop": True,
            "model": self.model_name,
            # llama.cpp's n_decoded: every sampled token, the EOS that ended the answer included
            "tokens_predicted": 0 if self.warmup or stats is None else stats.num_generated + stats.num_eos,
            "tokens_evaluated": len(self.prompt_ids),
            "generation_settings": self.settings,
            "has_new_line": "\n" in completion.text,
            # the context, not n_predict, ended the answer
            "truncated": bool(
                stats
                and stats.finish_reason == "length"
                and not self.warmup
                and (reply.n_predict < 0 or reply.n_predict > self.room)
            ),
            "stop_type": completion.stop_type,
            "stopping_word": "",
            "tokens_cached": (stats.num_reused_tokens if visible else 0) if stats else 0,
        }
        if reply.return_tokens and done is not None and not self.warmup:
            out["tokens"] = done.result.token_ids
        if completion.superseded:
            out["superseded"] = True  # extension: a newer request from the same client cancelled this one
        if visible:
            out["timings"] = _timings(stats, 0 if self.warmup else stats.num_generated + stats.num_eos)
        return out if reply.response_fields is None else pick(out, reply.response_fields)


def _stop_type(done: Finished) -> str:
    """llama.cpp's stop_type: eos, word (a stop string), limit (n_predict or the context)."""
    stats = done.result.stats
    if stats.finish_reason == "stop":
        return "eos" if stats.num_eos else "word"
    return "limit"


def _timings(stats, num_predicted: int) -> dict:
    """llama.cpp's timings object (server_slot_stats::to_json): prompt = the tokens the cache did
    not hold, predicted = the answer; draft counts when anything was drafted."""
    prompt_n = stats.num_prompt_tokens - stats.num_reused_tokens
    prompt_ms, predicted_ms = stats.prefill_ms, stats.decode_ms
    out = {
        "cache_n": stats.num_reused_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1000.0 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": num_predicted,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / num_predicted if num_predicted else 0.0,
        "predicted_per_second": 1000.0 * num_predicted / predicted_ms if predicted_ms > 0 else 0.0,
    }
    if stats.num_drafted:
        out["draft_n"], out["draft_n_accepted"] = stats.num_drafted, stats.num_accepted
    return out


def pick(answer: dict, paths: list[str]) -> dict:
    """llama.cpp's response_fields: {path: value} for the paths the answer has.
    Example: ({"a": {"b": 1}, "c": 2}, ["a/b", "d"]) -> {"a/b": 1}."""
    out = {}
    for path in paths:
        value: Any = answer
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out
