"""`/infill`: llama.cpp's code-completion route, as the llama.vim and llama.vscode plugins use it.

The request (input_prefix, input_suffix, input_extra, prompt, n_predict, n_indent,
t_max_predict_ms, samplers, ...) becomes a fill-in-the-middle prompt (draftwise.fim, laid out
and cut as llama.cpp's format_prompt_infill does) and a Job like any other; the answer has the
fields those clients read (content, stop, stop_type, tokens_predicted, truncated, tokens_cached,
generation_settings.n_ctx, timings), streamed as llama.cpp streams it (one JSON object per
server-sent event, the last with "stop": true, no [DONE]).

Editors send a request every few keystrokes: a new request from the same client supersedes
(cancels) its previous one. A client is (API key, remote IP address): llama.vim opens a new
connection per request, so the connection cannot name it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from draftwise.errors import BackendError, ConfigError, PromptTooLongError
from draftwise.fim import FimBudget, FimUnsupportedError, fim_prompt, fim_tokens
from draftwise.server import choices
from draftwise.server import protocol as p
from draftwise.server.errors import APIError
from draftwise.server.serving import Failed, Finished, Job, JobCancelled, Piece, ServerBusy, Serving
from draftwise.types import SamplingParams, SpeculationConfig

# llama.cpp's sampling defaults (common/common.h) and its default sampler chain.
DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, DEFAULT_MIN_P = 0.8, 40, 0.95, 0.05
DEFAULT_SAMPLERS = ("penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
# Samplers whose parameters draftwise applies (penalties: repeat_penalty over the last
# repeat_last_n tokens, presence and frequency penalties; logit_bias applies whatever the chain,
# as in llama.cpp); the others are accepted where their parameters leave them off (llama.cpp's
# defaults), and "infill" (llama.cpp's FIM heuristic that merges tokens sharing a prefix and may
# force EOG) is accepted and not applied: every editor plugin names it, and the answer is then
# drawn from the target's own distribution.
APPLIED_SAMPLERS = frozenset({"penalties", "top_k", "top_p", "min_p", "temperature"})
KNOWN_SAMPLERS = frozenset({*DEFAULT_SAMPLERS, "infill", "top_n_sigma", "adaptive_p"})
SUPERSEDED = "superseded by a newer request from the same client"
MAX_COMPLETIONS = 16  # n_cmpl's bound (llama.cpp's is its slot count; more queue here)


class InfillChunk(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    text: str
    filename: str = "tmp"


class InfillRequest(BaseModel):
    """llama.cpp's /infill body (tools/server/README.md, "POST /infill" and "POST /completion").
    Unknown fields are ignored; fields that would change the answer and are not supported here
    are refused by `unsupported()`."""

    model_config = ConfigDict(strict=True, extra="ignore")

    input_prefix: str
    input_suffix: str
    input_extra: list[InfillChunk] = Field(default_factory=list)
    prompt: str = ""
    n_predict: int = Field(-1, ge=-1, description="-1: until the context is full; 0: fill the cache only.")
    n_indent: int = Field(0, ge=0)
    t_max_predict_ms: int = Field(0, ge=0)
    t_max_prompt_ms: int = Field(0, description="Accepted and ignored, as llama.cpp's server does.")
    cache_prompt: bool = True
    stream: bool = False
    temperature: float = Field(DEFAULT_TEMPERATURE)
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    min_p: float = DEFAULT_MIN_P
    samplers: list[str] | None = None
    seed: int = -1
    stop: Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=16)] = Field(default_factory=list)
    ignore_eos: bool = False
    return_tokens: bool = False
    response_fields: list[str] | None = None  # answer only these ("timings/prompt_n" keeps that nested value)
    speculation: p.SpeculationOptions | None = None  # draftwise extension, as on /v1/completions
    # The "penalties" sampler (llama.cpp's defaults: off). NOTE: presence and frequency count the
    # answer's tokens (OpenAI's definition, as on /v1/completions); llama.cpp counts the last
    # repeat_last_n tokens of prompt and answer for them too.
    repeat_penalty: float = 1.0
    repeat_last_n: int = Field(64, ge=-1)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # llama.cpp's forms: [[token id or text, bias or false], ...] or {"token id or text": bias};
    # a text biases each of its tokens; false bans the token (here: bias -100).
    logit_bias: list | dict | None = None
    # Fields that change the answer: accepted at their llama.cpp defaults (off) only.
    dry_multiplier: float = 0.0
    xtc_probability: float = 0.0
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    dynatemp_range: float = 0.0
    mirostat: int = 0
    min_keep: int = 0
    n_probs: int = 0
    # Completions of the prompt (llama.cpp's n_cmpl; llama.vscode sends 3 by default and offers
    # the distinct ones): more than 1 is answered as a list, one result per completion.
    n_cmpl: int = Field(1, ge=1, le=MAX_COMPLETIONS)
    grammar: str | None = None
    json_schema: Any = None
    lora: Any = None

    def unsupported(self) -> str | None:
        """The first field set to a value this server cannot honour, else None."""
        for name, default in (
            ("dry_multiplier", 0.0),
            ("xtc_probability", 0.0),
            ("typical_p", 1.0),
            ("dynatemp_range", 0.0),
            ("mirostat", 0),
            ("min_keep", 0),
            ("n_probs", 0),
        ):
            if getattr(self, name) != default:
                return name
        if self.top_n_sigma > 0:
            return "top_n_sigma"
        for name in ("grammar", "json_schema", "lora"):
            if getattr(self, name):
                return name
        for name in self.samplers or ():
            if name not in KNOWN_SAMPLERS or name == "adaptive_p":
                return "samplers"
        return None


def logit_bias(value: Any, tokenizer, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """llama.cpp's logit_bias as (token id, bias) pairs: a key that is a number (or a string of
    digits) is a token id, another string biases each of its tokens; false is a ban (-100).
    Example: ([[15, 1.0], ["ab", false]]) -> ((15, 1.0), (id of "ab"'s tokens, -100.0), ...)."""
    items = list(value.items()) if isinstance(value, dict) else value or ()
    out: dict[int, float] = {}
    for item in items:
        pair = isinstance(item, (list, tuple)) and len(item) == 2
        key, bias = item if pair else (None, None)
        if not pair or bias is True or not isinstance(bias, (int, float)) or type(key) not in (int, str):
            raise ConfigError(f"logit_bias entries are [token id or text, bias or false] pairs, got {item!r}")
        bias = -100.0 if bias is False else float(bias)
        if isinstance(key, int) or key.isdigit():
            ids = [int(key)]
        else:
            ids = tokenizer.encode(key, add_special=False)
        for token in ids:
            if not 0 <= token < vocab_size:
                raise ConfigError(f"logit_bias: token id {token} is outside the vocabulary (size {vocab_size})")
            out[token] = bias
    return tuple(sorted(out.items()))


def infill_sampling(body: InfillRequest, max_tokens: int, tokenizer=None, vocab_size: int = 0) -> SamplingParams:
    """llama.cpp's chain as draftwise's transforms: a sampler left out of `samplers` is off
    (temperature then 1.0; penalties then none), a temperature <= 0 in the chain is greedy.

    NOTE: draftwise applies temperature before top-k/top-p/min-p (llama.cpp's default chain
    truncates first); top-k and greedy are the same either way."""
    chain = set(DEFAULT_SAMPLERS if body.samplers is None else body.samplers)
    temperature = max(0.0, body.temperature) if "temperature" in chain else 1.0
    top_k = body.top_k if "top_k" in chain and body.top_k > 0 else 0
    top_p = body.top_p if "top_p" in chain and 0 < body.top_p < 1 else 1.0
    min_p = body.min_p if "min_p" in chain and 0 < body.min_p < 1 else 0.0
    penalties = "penalties" in chain
    return SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repeat_penalty=body.repeat_penalty if penalties else 1.0,
        repeat_last_n=body.repeat_last_n,
        presence_penalty=body.presence_penalty if penalties else 0.0,
        frequency_penalty=body.frequency_penalty if penalties else 0.0,
        logit_bias=logit_bias(body.logit_bias, tokenizer, vocab_size) if body.logit_bias else (),
        seed=None if body.seed < 0 else body.seed % 2**64,
        max_tokens=max_tokens,
        stop=tuple(body.stop),
        ignore_eos=body.ignore_eos,
    )


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


class Clients:
    """The request each client has running (its jobs, one per completion); a newer one from the
    same client cancels them."""

    def __init__(self) -> None:
        self._jobs: dict[tuple, list[Job]] = {}

    def supersede(self, client: tuple, jobs: list[Job]) -> None:
        for previous in self._jobs.get(client, ()):
            previous.cancel(SUPERSEDED)
        self._jobs[client] = jobs

    def done(self, client: tuple, jobs: list[Job]) -> None:
        if self._jobs.get(client) is jobs:
            del self._jobs[client]


@dataclasses.dataclass
class _Answer:
    """What the route has to say about a job so far (the text after llama.cpp's cuts)."""

    job: Job
    text: str = ""
    sent: int = 0
    stop_type: str = "none"
    first_piece_at: float | None = None
    finished: Finished | None = None
    superseded: bool = False


def install(
    app: FastAPI,
    serving: Serving,
    model_name: str,
    *,
    count: Callable[[APIError], None],
    speculation: Callable[[Any, SpeculationConfig], tuple[SpeculationConfig | None, list[str] | None]],
    job_events: Callable[[Job, Request], AsyncIterator[Piece | Finished | Failed]],
) -> None:
    """Add /infill to app. speculation: the app's per-request speculation override (as for
    /v1/completions); job_events: the app's event stream of a job (a disconnect cancels it)."""
    engine = serving.engine
    clients = Clients()
    tokens = fim_tokens(engine.tokenizer)

    def prepare(body: InfillRequest) -> tuple[list[int], SamplingParams, int]:
        n_ctx = engine.target.n_ctx
        built = fim_prompt(
            engine.tokenizer,
            body.input_prefix,
            body.input_suffix,
            prompt=body.prompt,
            extra=[(c.filename, c.text) for c in body.input_extra],
            tokens=tokens,
            budget=FimBudget(n_ctx=n_ctx, n_predict=max(0, body.n_predict)),
        )
        room = max(1, n_ctx - len(built.ids))
        max_tokens = 1 if body.n_predict == 0 else room if body.n_predict < 0 else min(body.n_predict, room)
        return built.ids, infill_sampling(body, max_tokens, engine.tokenizer, engine.target.vocab_size), room

    @app.post("/infill", tags=["llama.cpp"], responses={s: {"model": p.ErrorResponse} for s in (400, 401, 503)})
    async def infill(body: InfillRequest, request: Request):
        field = body.unsupported()
        if field is not None:
            raise APIError(400, f"{field} is not supported by this server", param=field, code="unsupported_parameter")
        if tokens is None:
            raise APIError(
                400,
                str(
                    FimUnsupportedError(
                        "this model has no fill-in-the-middle tokens (prefix, suffix "
                        "and middle); /infill needs a FIM-trained model such as "
                        "Qwen2.5-Coder"
                    )
                ),
                code="fim_unsupported",
            )
        warmup = body.n_predict == 0
        config, drafters = speculation(body, engine.speculation)
        if warmup:  # fill the cache: one token, drafting nothing, no answer
            config, drafters = dataclasses.replace(config or engine.speculation, enabled=False), None
        tenant = request.scope.get("state", {}).get("tenant")
        client = (tenant, request.client.host if request.client else None)
        jobs: list[Job] = []
        try:
            prompt_ids, sampling, room = await asyncio.to_thread(prepare, body)
            copies = 1 if warmup else body.n_cmpl
            jobs = [Job(f"infill-{uuid.uuid4().hex[:24]}", "infill", prompt_ids, tenant=tenant) for _ in range(copies)]
            clients.supersede(client, jobs)
            for copy, job in enumerate(jobs):
                seeded = dataclasses.replace(sampling, seed=choices.choice_seed(sampling.seed, copy))
                await asyncio.to_thread(serving.submit, job, seeded, config, drafters)
        except UnicodeEncodeError as exc:
            raise APIError(
                400, f"the request holds U+{ord(exc.object[exc.start]):04X}, a lone surrogate", code="invalid_value"
            ) from None
        except (PromptTooLongError, ServerBusy, ConfigError, BackendError) as exc:
            for job in jobs:
                job.cancel("a sibling completion was refused")
            clients.done(client, jobs)
            if isinstance(exc, PromptTooLongError):
                raise APIError(400, str(exc), code="context_length_exceeded") from None
            if isinstance(exc, ServerBusy):
                raise APIError(503, str(exc), type="server_error", code="overloaded") from None
            named = ("logit_bias", "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty")
            param = next((f for f in named if str(exc).startswith(f)), None)
            raise APIError(400, str(exc), param=param, code="invalid_value") from None
        answers = [_Answer(job) for job in jobs]
        settings = {
            "n_ctx": engine.target.n_ctx,
            "n_predict": body.n_predict,
            "model": model_name,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "min_p": sampling.min_p,
            "n_indent": body.n_indent,
            "t_max_predict_ms": body.t_max_predict_ms,
            "stop": list(sampling.stop),
            "samplers": body.samplers or list(DEFAULT_SAMPLERS),
        }

        def advance(answer: _Answer, event: Piece | Finished | Failed) -> str | None:
            """Take one event of answer's job; returns new text to send (None: nothing new)."""
            job = answer.job
            if isinstance(event, Failed):
                if isinstance(event.error, JobCancelled) and job.cancel_reason == SUPERSEDED:
                    answer.superseded = True
                    return None
                error = (
                    APIError(503, "the server is shutting down", type="server_error", code="unavailable")
                    if isinstance(event.error, JobCancelled)
                    else APIError(500, f"generation failed: {event.error}", type="server_error")
                )
                raise error
            if isinstance(event, Finished):
                answer.finished = event
                answer.superseded = job.cancel_reason == SUPERSEDED
                if answer.stop_type == "none" and event.result.finish_reason != "cancelled":
                    answer.stop_type = _stop_type(event)
                return None
            if warmup or answer.stop_type != "none":
                return None  # a warm-up has no answer; after a cut, the rest is dropped
            now = time.monotonic()
            answer.first_piece_at = answer.first_piece_at or now
            before = len(answer.text)
            answer.text += event.text
            cut = indent_cut(answer.text, body.n_indent)
            newline = event.text.find("\n")
            if (
                body.t_max_predict_ms
                and newline >= 0
                and 1000 * (now - answer.first_piece_at) > body.t_max_predict_ms
                and (cut is None or before + newline + 1 < cut)
            ):
                cut = before + newline + 1  # llama.cpp: past the time limit, stop at a newline
            if cut is not None:
                answer.text, answer.stop_type = answer.text[:cut], "limit"
                job.cancel("n_indent or t_max_predict_ms reached")
            new, answer.sent = answer.text[answer.sent :], len(answer.text)
            return new

        def final(index: int, content: str) -> dict:
            answer = answers[index]
            done = answer.finished
            stats = done.result.stats if done is not None else None
            visible = done is not None and done.cache_visible
            out = {
                "index": index,
                "content": content,
                "tokens": [],
                "id_slot": -1,
                "stop": True,
                "model": model_name,
                "tokens_predicted": 0 if warmup or stats is None else stats.num_generated,
                "tokens_evaluated": len(prompt_ids),
                "generation_settings": settings,
                "has_new_line": "\n" in answer.text,
                # the context, not n_predict, ended the answer
                "truncated": bool(
                    stats
                    and stats.finish_reason == "length"
                    and not warmup
                    and (body.n_predict < 0 or body.n_predict > room)
                ),
                "stop_type": answer.stop_type,
                "stopping_word": "",
                "tokens_cached": (stats.num_reused_tokens if visible else 0) if stats else 0,
            }
            if body.return_tokens and done is not None and not warmup:
                out["tokens"] = done.result.token_ids
            if answer.superseded:
                out["superseded"] = True  # extension: a newer request from the same client cancelled this one
            if visible:
                out["timings"] = _timings(stats, 0 if warmup else stats.num_generated)
            return out if body.response_fields is None else _pick(out, body.response_fields)

        streams = [job_events(job, request) for job in jobs]

        def unfinished(reason: str) -> None:
            """Cancel the completions still running (a sibling failed, or the client left)."""
            for answer in answers:
                if answer.finished is None:
                    answer.job.cancel(reason)
            clients.done(client, jobs)

        async def events() -> AsyncIterator[str]:
            try:
                async for index, event in choices.merged(streams):
                    try:
                        new = advance(answers[index], event)
                    except APIError as error:
                        count(error)
                        yield f"data: {json.dumps({'error': error.body()['error']})}\n\n"
                        return
                    if new:
                        partial = {
                            "index": index,
                            "content": new,
                            "tokens": [],
                            "stop": False,
                            "id_slot": -1,
                            "tokens_predicted": 0,
                            "tokens_evaluated": len(prompt_ids),
                        }
                        yield f"data: {json.dumps(partial, ensure_ascii=False)}\n\n"
                for index in range(len(answers)):
                    yield f"data: {json.dumps(final(index, ''), ensure_ascii=False)}\n\n"
            finally:
                unfinished("the stream ended")

        if body.stream:
            return StreamingResponse(
                events(),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        try:
            async for index, event in choices.merged(streams):
                advance(answers[index], event)
        finally:
            unfinished("the request ended")
        results = [final(index, "" if warmup else answers[index].text) for index in range(len(answers))]
        # llama.cpp answers one completion as an object and several as a list of them
        return JSONResponse(results[0] if len(results) == 1 else results)


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


def _pick(answer: dict, paths: list[str]) -> dict:
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
