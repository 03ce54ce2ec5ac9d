"""The HTTP surface: `create_app(engine, model_name, api_key=None) -> FastAPI`.

Routes /v1/completions and /v1/chat/completions (JSON, or server-sent events in OpenAI's
chunk format), /v1/models, /health, /metrics. A request becomes a Job on the Serving
queue; a client that goes away cancels its job, which the engine sees at its next step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from draftwise.constraints import Constraint, llguidance_tokenizer
from draftwise.engine import Engine
from draftwise.errors import BackendError, ConfigError, ConstraintError, PromptTooLongError
from draftwise.fim import FimUnsupportedError, fim_prompt
from draftwise.server import choices, errors, infill
from draftwise.server import protocol as p
from draftwise.server.errors import BODY_TIMEOUT_S, APIError
from draftwise.server.metrics import ServerMetrics
from draftwise.server.serving import MAX_QUEUE, Failed, Finished, Job, JobCancelled, Piece, ServerBusy, Serving
from draftwise.server.tools import ChatTools, answer, chat_tools, deltas, message_fields
from draftwise.types import SamplingParams, SpeculationConfig

DISCONNECT_POLL_S = 0.25
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint

_ERROR_STATUSES = {status: {"model": p.ErrorResponse} for status in (400, 401, 403, 404, 408, 413, 500, 503)}
_STREAM_RESPONSE = {
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
    "description": "JSON, or server-sent events when `stream` is true.",
}


def create_app(
    engine: Engine,
    model_name: str,
    api_key: str | None = None,
    *,
    api_keys: Sequence[str] = (),
    metrics_key: str | None = None,
    log_content: bool = False,
    max_queue: int = MAX_QUEUE,
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> FastAPI:
    """api_key / api_keys: bearer keys, one per tenant (a tenant never learns how much of its prompt
    another tenant's request left in the cache). metrics_key: the operator's key for /metrics, which
    counts every tenant's requests; without it, a server of several tenants keeps /metrics closed.
    log_content: let error logs quote requests. body_timeout_s: a request body must have arrived
    this long after its headers (then 408). An engine whose target has several slots decodes that
    many requests together; max_queue more may wait (then 503)."""
    keys = tuple(dict.fromkeys([*([api_key] if api_key else []), *api_keys]))
    metrics = ServerMetrics()
    serving = Serving(engine, metrics, max_queue=max_queue)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        serving.close()

    # NOTE: no /docs or /redoc: FastAPI's pages load their scripts from a CDN, unusable offline;
    # /openapi.json is served and works with any OpenAPI viewer.
    app = FastAPI(
        title="draftwise",
        summary="OpenAI-compatible server for lossless speculative decoding.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.serving = serving
    errors.install(app, metrics, keys, metrics_key=metrics_key, log_content=log_content, body_timeout_s=body_timeout_s)
    created = int(time.time())

    def count(error: APIError) -> None:
        metrics.observe_error(error.status, error.type)

    async def start(
        body: p._GenerationRequest,
        request: Request,
        endpoint: str,
        prefix: str,
        *,
        prompt: Any = None,
        messages: list[dict] | None = None,
        max_tokens: int | None = None,
        default_max_tokens: int | None = None,
        tools: ChatTools | None = None,
        copies: int | None = None,
    ) -> list[Job]:
        """Validate, tokenise and queue a request, one Job per choice (each prompt `copies` times,
        default n, see server.choices); library errors become 4xx APIErrors (then no job stays
        queued). copies > n (completions' best_of): each answer's logprobs are kept for ranking.

        NOTE: everything that grows with the request (tokenising the prompt and the prediction,
        compiling the constraint) runs in a worker thread: on the event loop, one 12 MB
        prediction held every other client (and /health) for 37 s.
        """
        _check_request(body, model_name)
        param = "messages" if messages is not None else "prompt"
        job_id, jobs = f"{prefix}-{uuid.uuid4().hex[:24]}", []
        try:
            items = [None] if messages is not None else choices.prompts(prompt, engine.target.vocab_size)
            try:
                for item in items:
                    prepared = await asyncio.to_thread(
                        prepare, body, item, messages, max_tokens, default_max_tokens, tools
                    )
                    per_prompt = copies or body.n or 1
                    for copy in range(per_prompt):
                        sampling = dataclasses.replace(
                            prepared.sampling, seed=choices.choice_seed(prepared.sampling.seed, copy)
                        )
                        if per_prompt > (body.n or 1) and sampling.logprobs is None:
                            sampling = dataclasses.replace(sampling, logprobs=0)  # best_of ranks by them
                        job = Job(
                            job_id,
                            endpoint,
                            prepared.prompt_ids,
                            tenant=request.scope.get("state", {}).get("tenant"),
                            predicted=prepared.prediction is not None,
                        )
                        jobs.append(
                            await asyncio.to_thread(
                                serving.submit,
                                job,
                                sampling,
                                prepared.speculation,
                                prepared.drafters,
                                prepared.prediction,
                            )
                        )
            except BaseException:
                for job in jobs:
                    job.cancel("another choice of the request was refused")
                raise
            return jobs
        except UnicodeEncodeError as exc:  # a lone surrogate ("\udfff") is not text a tokenizer can take
            raise APIError(
                400,
                f"the request holds U+{ord(exc.object[exc.start]):04X}, a lone surrogate, which "
                "is not valid Unicode text",
                param=param,
                code="invalid_value",
            ) from None
        except PromptTooLongError as exc:
            raise APIError(400, str(exc), param=param, code="context_length_exceeded") from None
        except ServerBusy as exc:
            raise APIError(503, str(exc), type="server_error", code="overloaded") from None
        except ConstraintError as exc:
            raise APIError(400, str(exc), param=_constraint_param(body), code="invalid_value") from None
        except ConfigError as exc:
            raise APIError(400, str(exc), code="invalid_value") from None
        except BackendError as exc:  # the tokenizer or chat template refused the input
            raise APIError(400, str(exc), param=param, code="invalid_prompt") from None
        except Exception as exc:
            if type(exc).__module__.startswith("jinja2"):  # a chat template's raise_exception()
                raise APIError(
                    400, f"the chat template rejected the messages: {exc}", param="messages", code="invalid_prompt"
                ) from None
            raise

    def prepare(
        body: p._GenerationRequest,
        prompt: Any,
        messages: list[dict] | None,
        max_tokens: int | None,
        default_max_tokens: int | None,
        tools: ChatTools | None = None,
    ) -> _Prepared:
        """The request as engine values (worker thread): prompt ids, sampling, speculation."""
        text, prompt_ids = (None, None) if messages is not None else prompt
        suffix = getattr(body, "suffix", None)
        if suffix:  # fill in the middle: the prompt is the text before the gap, the suffix the text after
            prompt_ids = _fim_ids(engine, text, suffix)
        elif prompt_ids is None:
            prompt_ids = serving.encode(text, messages, tools.rendered if tools else None)
        constraint = tools.plan.constraint if tools else _constraint(body)
        if constraint is not None:  # the model's tokenizer adapter, built once
            llguidance_tokenizer(engine.target)
        n_ctx = engine.target.n_ctx
        if max_tokens is not None and len(prompt_ids) + max_tokens > n_ctx:
            # As OpenAI does: a request that cannot be honoured in full is refused, not cut short.
            raise APIError(
                400,
                f"this model's context holds {n_ctx} tokens, but {len(prompt_ids) + max_tokens} "
                f"were requested ({len(prompt_ids)} in the prompt, {max_tokens} to generate); "
                "lower max_tokens or shorten the prompt",
                param="max_completion_tokens" if "max_completion_tokens" in body.model_fields_set else "max_tokens",
                code="context_length_exceeded",
            )
        # With no max_tokens a chat request may fill the context, as OpenAI's does.
        limit = (
            max_tokens if max_tokens is not None else min(default_max_tokens or n_ctx, max(1, n_ctx - len(prompt_ids)))
        )
        speculation, drafters = _speculation(body, engine.speculation)
        return _Prepared(prompt_ids, _sampling(body, limit, constraint), speculation, drafters, _prediction(body))

    async def stream_or_collect(
        jobs: list[Job],
        body: p._GenerationRequest,
        request: Request,
        *,
        opening: Callable[[int], str] | None,
        text_chunk: Callable[[int, Piece], str],
        final_chunk: Callable[[int, Finished], str],
        usage_chunk: Callable[[p.Usage], str],
        whole: Callable[[list[Finished]], Any],
    ):
        """The choices' answers as one JSON reply, or their chunks as server-sent events (each
        chunk names its choice's index; usage, when asked, sums the choices at the end)."""
        if not body.stream:
            return whole(list(await asyncio.gather(*(_collect(job, request, _constraint_param(body)) for job in jobs))))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def events() -> AsyncIterator[str]:
            if opening is not None:
                for i in range(len(jobs)):
                    yield opening(i)
            finished: list[Finished] = []
            finished_index: dict[int, int] = {}
            async for i, event in choices.merged([_job_events(job, request) for job in jobs]):
                if isinstance(event, Piece):
                    yield text_chunk(i, event)
                elif isinstance(event, Finished):
                    finished.append(event)
                    finished_index[id(event)] = i
                    yield final_chunk(i, event)
                    if include_usage and len(finished) == len(jobs):
                        yield usage_chunk(_usage(sorted(finished, key=lambda d: finished_index[id(d)]), body.n or 1))
                else:
                    error = _failure(event, _constraint_param(body))
                    count(error)
                    yield f"data: {json.dumps(error.body())}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )

    @app.post(
        "/v1/chat/completions",
        response_model=p.ChatCompletion,
        tags=["openai"],
        responses={200: _STREAM_RESPONSE, **_ERROR_STATUSES},
    )
    async def chat_completions(body: p.ChatCompletionRequest, request: Request):
        messages = [_message_dict(i, m) for i, m in enumerate(body.messages)]
        tools, messages = chat_tools(body, engine.tokenizer, messages)
        jobs = await start(
            body,
            request,
            "chat",
            "chatcmpl",
            messages=messages,
            max_tokens=body.max_completion_tokens or body.max_tokens,
            tools=tools,
        )
        now, with_usage = int(time.time()), bool(body.stream_options and body.stream_options.include_usage)
        tokenizer = engine.tokenizer

        def logprobs(entries) -> dict | None:
            return choices.chat_logprobs(tokenizer, entries) if body.logprobs else None

        def chunk(
            index: int, delta: p.ChatDelta | None, finish: str | None = None, usage: p.Usage | None = None, entries=None
        ) -> str:
            parts = (
                []
                if delta is None
                else [p.ChatChunkChoice(index=index, delta=delta, finish_reason=finish, logprobs=entries)]
            )
            return _sse(
                p.ChatCompletionChunk(id=jobs[0].id, created=now, model=model_name, choices=parts, usage=usage),
                with_usage,
            )

        def message(done: Finished) -> tuple[p.AssistantMessage, str | None]:
            if tools is None:
                return p.AssistantMessage(content=done.result.text), _finish_reason(done)
            fields, finish = answer(tools, done.result.text, _finish_reason(done))
            return p.AssistantMessage(**fields), finish

        def whole(done: list[Finished]) -> p.ChatCompletion:
            usage = _usage(done, body.n or 1)
            return p.ChatCompletion(
                id=jobs[0].id,
                created=now,
                model=model_name,
                usage=usage,
                choices=[
                    p.ChatChoice(index=i, message=m, finish_reason=finish, logprobs=logprobs(d.result.logprobs or []))
                    for i, d in enumerate(done)
                    for m, finish in [message(d)]
                ],
            )

        def text_chunk(i: int, piece: Piece) -> str:
            if tools is None:
                return chunk(i, p.ChatDelta(content=piece.text), entries=logprobs(piece.logprobs))
            return deltas(tools.feed(i, piece.text), lambda delta: chunk(i, p.ChatDelta(**delta)))

        def final_chunk(i: int, done: Finished) -> str:
            if tools is None:
                return chunk(i, p.ChatDelta(), _finish_reason(done))
            held, called = tools.finish(i)
            finish = _finish_reason(done)
            return deltas(held, lambda delta: chunk(i, p.ChatDelta(**delta))) + chunk(
                i, p.ChatDelta(), "tool_calls" if called and finish == "stop" else finish
            )

        return await stream_or_collect(
            jobs,
            body,
            request,
            opening=lambda i: chunk(i, p.ChatDelta(role="assistant", content="")),
            text_chunk=text_chunk,
            final_chunk=final_chunk,
            usage_chunk=lambda usage: chunk(0, None, usage=usage),
            whole=whole,
        )

    @app.post(
        "/v1/completions",
        response_model=p.Completion,
        tags=["openai"],
        responses={200: _STREAM_RESPONSE, **_ERROR_STATUSES},
    )
    async def completions(body: p.CompletionRequest, request: Request):
        n, best_of = body.n or 1, body.best_of or body.n or 1
        if best_of < n:
            raise APIError(400, f"best_of ({best_of}) must be at least n ({n})", param="best_of", code="invalid_value")
        if best_of > n and body.stream:
            why = "best_of > n cannot be streamed (the best are known at the end)"
            raise APIError(400, why, param="best_of", code="invalid_value")
        jobs = await start(
            body,
            request,
            "completions",
            "cmpl",
            prompt=body.prompt,
            max_tokens=body.max_tokens,
            default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
            copies=best_of,
        )
        now, with_usage = int(time.time()), bool(body.stream_options and body.stream_options.include_usage)
        tokenizer, echoed, sent = engine.tokenizer, set(), {}

        def chunk(
            index: int,
            text: str | None,
            finish: str | None = None,
            usage: p.Usage | None = None,
            entries: dict | None = None,
        ) -> str:
            parts = (
                []
                if text is None
                else [p.CompletionChoice(index=index, text=text, finish_reason=finish, logprobs=entries)]
            )
            return _sse(
                p.Completion(id=jobs[0].id, created=now, model=model_name, choices=parts, usage=usage), with_usage
            )

        def echo(index: int, prompt_logprobs) -> tuple[str, dict | None]:
            """The prompt's text and (if asked) logprobs, once, with a streamed choice's first
            text (the first prompt token has none)."""
            if not body.echo or index in echoed:
                return "", None
            echoed.add(index)
            ids = jobs[index].prompt_ids
            entries = None
            if body.logprobs is not None:
                rows = [None, *(prompt_logprobs or ())]
                entries = choices.completion_logprobs(tokenizer, rows, ids, body.logprobs)
            return tokenizer.decode(ids), entries

        def joined(head: dict | None, tail: dict | None) -> dict | None:
            if head is None or tail is None:
                return head or tail
            return {key: head[key] + tail[key] for key in head}

        def text_chunk(index: int, piece: Piece) -> str:
            prefix, head = echo(index, piece.prompt_logprobs)
            entries = None
            start = sent.get(index, 0) + len(prefix)  # text_offset counts from the choice's first text
            if body.logprobs is not None:
                tokens = [e.token for e in piece.logprobs]
                entries = choices.completion_logprobs(tokenizer, piece.logprobs, tokens, body.logprobs, offset=start)
            sent[index] = start + len(piece.text)
            return chunk(index, prefix + piece.text, entries=joined(head, entries))

        def final_chunk(index: int, done: Finished) -> str:
            prefix, head = echo(index, done.result.prompt_logprobs)  # an answer without text
            return chunk(index, prefix, _finish_reason(done), entries=head)

        def whole(done: list[Finished]) -> p.Completion:
            parts = []
            for i, d in enumerate(choices.best(done, best_of, n)):
                result, text, entries = d.result, d.result.text, None
                prompt_text = tokenizer.decode(result.prompt_ids) if body.echo else ""
                if body.logprobs is not None:
                    tokens = [e.token for e in result.logprobs or []]
                    rows = list(result.logprobs or [])
                    if body.echo:  # the first prompt token has no logprob
                        tokens = [*result.prompt_ids, *tokens]
                        rows = [None, *(result.prompt_logprobs or []), *rows]
                    entries = choices.completion_logprobs(tokenizer, rows, tokens, body.logprobs)
                parts.append(
                    p.CompletionChoice(
                        index=i, text=prompt_text + text, finish_reason=_finish_reason(d), logprobs=entries
                    )
                )
            usage = _usage(done, best_of)  # every candidate's tokens
            return p.Completion(id=jobs[0].id, created=now, model=model_name, usage=usage, choices=parts)

        return await stream_or_collect(
            jobs,
            body,
            request,
            opening=None,
            text_chunk=text_chunk,
            final_chunk=final_chunk,
            usage_chunk=lambda usage: chunk(0, None, usage=usage),
            whole=whole,
        )

    choices.install_tokenize(app, engine.tokenizer, engine.target.vocab_size, asyncio.to_thread)
    infill.install(app, serving, model_name, count=count, speculation=_speculation, job_events=_job_events)

    @app.get("/v1/models", response_model=p.ModelList, tags=["openai"], responses=_ERROR_STATUSES)
    async def list_models() -> p.ModelList:
        return p.ModelList(data=[p.ModelCard(id=model_name, created=created)])

    @app.get("/v1/models/{model_id:path}", response_model=p.ModelCard, tags=["openai"], responses=_ERROR_STATUSES)
    async def get_model(model_id: str) -> p.ModelCard:
        if model_id != model_name:
            raise APIError(404, f"the model {model_id!r} does not exist", param="model", code="model_not_found")
        return p.ModelCard(id=model_name, created=created)

    @app.get("/health", response_model=p.Health)
    async def health() -> p.Health:
        return p.Health(
            model=model_name,
            queue_length=serving.queue_length,
            running=bool(serving.running),
            slots=engine.num_slots,
            active=len(serving.running),
        )

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}, **{s: _ERROR_STATUSES[s] for s in (401, 403)}},
        description="Prometheus text format, every tenant's requests together: with several API keys "
        "it answers the metrics key only.",
    )
    async def prometheus() -> Response:
        return Response(metrics.render(), headers={"Content-Type": metrics.content_type})

    return app


# ---------------------------------------------------------------------- request -> engine values
@dataclasses.dataclass(frozen=True)
class _Prepared:
    """A request as the engine takes it (Serving.submit's arguments)."""

    prompt_ids: list[int]
    sampling: SamplingParams
    speculation: SpeculationConfig | None
    drafters: list[str] | None
    prediction: str | None


def _check_request(body: p._GenerationRequest, model_name: str) -> None:
    if body.model != model_name:
        raise APIError(
            404,
            f"the model {body.model!r} does not exist; this server serves {model_name!r}",
            param="model",
            code="model_not_found",
        )
    field = body.unsupported()
    if field is not None:
        raise APIError(400, f"{field} is not supported by this server", param=field, code="unsupported_parameter")


def _constraint(body: p._GenerationRequest) -> Constraint | None:
    """response_format (OpenAI) or the grammar / regex extensions -> a Constraint; at most one."""
    fmt = body.response_format
    given = [
        name
        for name, on in (
            ("response_format", fmt is not None and fmt.type != "text"),
            ("grammar", body.grammar is not None),
            ("regex", body.regex is not None),
        )
        if on
    ]
    if len(given) > 1:
        raise APIError(
            400,
            f"give one of response_format, grammar and regex, not {' and '.join(given)}",
            param=given[1],
            code="invalid_value",
        )
    if body.grammar is not None:
        return Constraint.grammar(body.grammar)
    if body.regex is not None:
        return Constraint.regex(body.regex)
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Constraint.json_object()
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise APIError(
            400,
            "response_format of type json_schema needs json_schema.schema",
            param="response_format.json_schema.schema",
            code="invalid_value",
        )
    return Constraint.json_schema(fmt.json_schema.schema_)


def _prediction(body: p._GenerationRequest) -> str | None:
    if body.prediction is None:
        return None
    try:
        return body.prediction.text()
    except ValueError as exc:
        raise APIError(400, str(exc), param="prediction.content", code="invalid_value") from None


def _constraint_param(body: p._GenerationRequest) -> str:
    if getattr(body, "tools", None):
        return "tools"
    return "grammar" if body.grammar is not None else "regex" if body.regex is not None else "response_format"


def _sampling(body: p._GenerationRequest, max_tokens: int, constraint: Constraint | None = None) -> SamplingParams:
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,  # OpenAI's default
        top_k=body.top_k or 0,
        top_p=1.0 if body.top_p is None else body.top_p,
        min_p=body.min_p or 0.0,
        seed=None if body.seed is None else body.seed % 2**64,  # numpy seeds must be non-negative
        max_tokens=max_tokens,
        stop=stop,
        ignore_eos=body.ignore_eos,
        constraint=constraint,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repeat_penalty=1.0 if body.repeat_penalty is None else body.repeat_penalty,
        repeat_last_n=64 if body.repeat_last_n is None else body.repeat_last_n,
        logit_bias=_logit_bias(body.logit_bias),
        **_logprobs(body),
    )


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's logit_bias (token ids as JSON object keys) -> {id: bias}; a key that is no id is a 400."""
    out = {}
    for key, value in (bias or {}).items():
        if not key.strip().isdigit():
            raise APIError(400, f"logit_bias keys are token ids, got {key!r}", param="logit_bias", code="invalid_value")
        out[int(key)] = value
    return out


def _logprobs(body: p._GenerationRequest) -> dict[str, int | None]:
    """What logprobs a request asks for: chat `logprobs` + `top_logprobs`, completions `logprobs`
    (the alternatives per token) and, with `echo`, the prompt's too."""
    if isinstance(body, p.ChatCompletionRequest):
        if body.top_logprobs and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
        return {"logprobs": (body.top_logprobs or 0) if body.logprobs else None}
    num = getattr(body, "logprobs", None)
    return {"logprobs": num, "prompt_logprobs": num if getattr(body, "echo", False) else None}


def _speculation(
    body: p._GenerationRequest, base: SpeculationConfig
) -> tuple[SpeculationConfig | None, list[str] | None]:
    options = body.speculation
    if options is None:
        return None, None
    max_k = options.max_draft_tokens or base.max_draft_tokens
    config = dataclasses.replace(
        base,
        policy=options.policy or base.policy,
        max_draft_tokens=max_k,
        min_draft_tokens=min(base.min_draft_tokens, max_k),
        enabled=base.enabled if options.enabled is None else options.enabled,
    )
    return config, options.drafters


def _message_dict(index: int, message: p.ChatMessage) -> dict[str, Any]:
    content = message.content
    if content is None and message.role != "assistant":
        raise APIError(
            400,
            f"a {message.role} message needs content (a string or text parts), got null",
            param=f"messages.{index}.content",
            code="invalid_value",
        )
    if isinstance(content, list):
        for part in content:
            if part.type != "text" or part.text is None:
                raise APIError(
                    400,
                    f"only text content parts are supported, got type {part.type!r}",
                    param=f"messages.{index}.content",
                    code="unsupported_value",
                )
        content = "".join(part.text or "" for part in content)
    # Chat templates know system/user/assistant/tool; OpenAI's newer "developer" is a system message.
    return {
        "role": "system" if message.role == "developer" else message.role,
        "content": content or "",
        **message_fields(message),
    }


def _fim_ids(engine: Engine, prefix: str | None, suffix: str) -> list[int]:
    """A /v1/completions prompt with a suffix: the model's single-file fill-in-the-middle prompt."""
    if prefix is None:
        raise APIError(
            400, "a prompt given as token ids cannot take a suffix; send the text", param="prompt", code="invalid_value"
        )
    try:
        return fim_prompt(engine.tokenizer, prefix, suffix, repo_level=False).ids
    except FimUnsupportedError as exc:
        raise APIError(400, str(exc), param="suffix", code="fim_unsupported") from None


# ---------------------------------------------------------------------- engine results -> responses
# Figures that grow with the prompt work a cache saved: the target's prefill, and the draft
# model's catch-up at its first proposal (inside decode and draft time).
_CACHE_TIMINGS = ("prefill_ms", "decode_ms", "draft_ms", "tokens_per_second", "tokens_per_second_e2e")


def _usage(choices_done: Finished | list[Finished], n: int = 1) -> p.Usage:
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


def _finish_reason(done: Finished) -> str | None:
    reason = done.result.finish_reason
    return reason if reason in ("stop", "length") else None


def _sse(chunk: Any, include_usage: bool) -> str:
    data = chunk.model_dump(mode="json")
    for choice in data["choices"]:
        if "delta" in choice:  # OpenAI leaves unset delta fields out: {"content": "x"}, {}
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
    if not include_usage:
        data.pop("usage")
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _failure(event: Failed, constraint_param: str | None = None) -> APIError:
    """The error a failed job answers: a constraint that could not be followed while decoding
    (a lexer or parser limit reached mid-answer) is the request's fault, 400 naming its field."""
    if isinstance(event.error, JobCancelled):
        return APIError(503, "the server is shutting down", type="server_error", code="unavailable")
    if isinstance(event.error, ConstraintError):
        return APIError(400, str(event.error), param=constraint_param, code="invalid_value")
    return APIError(500, f"generation failed: {event.error}", type="server_error")


async def _job_events(job: Job, request: Request) -> AsyncIterator[Piece | Finished | Failed]:
    """The job's events up to the last one; a client that disconnects cancels the job.

    NOTE: one pending get is kept across polls (rather than wait_for, which can drop an
    item when the timeout and the put race); the disconnect check runs every
    DISCONNECT_POLL_S whether or not events arrive.
    """
    getter: asyncio.Future | None = None
    finished = False
    next_check = time.monotonic() + DISCONNECT_POLL_S
    try:
        while True:
            if getter is None:
                getter = asyncio.ensure_future(job.next_event())
            done, _ = await asyncio.wait({getter}, timeout=max(0.0, next_check - time.monotonic()))
            if time.monotonic() >= next_check:  # also while pieces keep coming (non-streaming)
                if await request.is_disconnected():
                    return
                next_check = time.monotonic() + DISCONNECT_POLL_S
            if not done:
                continue
            event, getter = getter.result(), None
            finished = not isinstance(event, Piece)
            yield event
            if finished:
                return
    finally:
        if getter is not None:
            getter.cancel()
        if not finished:  # the client went away, or the stream was closed under us
            job.cancel("client disconnected")


async def _collect(job: Job, request: Request, constraint_param: str | None = None) -> Finished:
    async for event in _job_events(job, request):
        if isinstance(event, Finished):
            if event.result.finish_reason == "cancelled":
                raise APIError(
                    503, "the generation was cancelled (server shutting down)", type="server_error", code="unavailable"
                )
            return event
        if isinstance(event, Failed):
            raise _failure(event, constraint_param)
    # Only reached when the client disconnected; nobody reads this reply.
    raise APIError(400, "client disconnected", code="client_disconnected")
