"""Each protocol's request -> the engine's request (`EngineRequest`: prompt ids, sampling, speculation).

One translator per protocol, run once per request, each a function of (engine, body, ...) ->
prepared.Prepared (the engine's request of each prompt and the reply the answer reads): `chat`
and `completions` (/v1/chat/completions and /v1/completions: OpenAI's fields and draftwise's
extensions, an OpenAIReply) and `infill` (llama.cpp's /infill: its fields and sampler chain, an
InfillReply). Another API's translator (Ollama's /api/chat, OpenAI's Responses, Anthropic's
Messages) sits beside them and shares `speculation` and `refusals`. A translator raises
APIError (400, naming the field) for what the engine cannot take; it tokenises, so routes run it
in a worker thread.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from draftwise.constraints import Constraint, llguidance_tokenizer
from draftwise.engine import Engine
from draftwise.errors import ConfigError
from draftwise.fim import FimBudget, FimTokens, FimUnsupportedError, fim_prompt
from draftwise.server import choices
from draftwise.server import names as model_names
from draftwise.server import protocol as p
from draftwise.server.errors import APIError, openai_refusal
from draftwise.server.llama_protocol import DEFAULT_SAMPLERS, InfillRequest
from draftwise.server.prepared import EngineRequest, Prepared, Reply
from draftwise.server.tools import ChatTools, chat_tools, message_fields
from draftwise.types import SamplingParams, SpeculationConfig

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint


@dataclasses.dataclass(frozen=True)
class OpenAIReply(Reply):
    """How a /v1/chat/completions or /v1/completions request (or the Responses request that means
    a chat one) is answered; prompt_param: the field a refused prompt names."""

    include_usage: bool = False  # a streamed answer ends with a usage chunk
    n: int = 1  # choices per prompt
    best_of: int = 1  # jobs per prompt (n where the request has no best_of), the n best answered
    echo: bool = False  # completions: the prompt first
    logprobs: int | None = None  # alternatives per token shown (0: the token's own); None: no logprobs
    prompt_param: str = "messages"


# ---------------------------------------------------------------------- OpenAI: chat and completions
def check_model(body: p._GenerationRequest, model_name: str, names: Sequence[str] = ()) -> None:
    """The model named must be this server's (any of its names, see server/names.py), and every
    field set must be one it honours."""
    if not model_names.answers_to(body.model, model_name, names):
        raise APIError(
            404,
            f"the model {model_names.quoted(body.model)} does not exist; this server serves {model_name!r}",
            param="model",
            code="model_not_found",
        )
    field = body.unsupported()
    if field is not None:
        raise APIError(400, f"{field} is not supported by this server", param=field, code="unsupported_parameter")


def chat(
    engine: Engine,
    body: p.ChatCompletionRequest,
    served: tuple[str, Sequence[str]],
    capacity: int,
    *,
    prompt_param: str = "messages",
) -> Prepared[OpenAIReply]:
    """A /v1/chat/completions request, translated once: its messages and tools, its prompt, its
    reply. served: the model's name and its other names (check_model); capacity: the choices the
    server can hold at once. It tokenises, so routes run it in a worker thread; a library error
    is the APIError of errors.openai_refusal (prompt_param: the field a refused prompt names)."""
    reply = _openai_reply(body, prompt_param, body.n or 1)
    with refusals(reply.prompt_param, reply.constraint_param):
        tools, messages = chat_tools(body, engine.tokenizer, chat_messages(body))
        check_model(body, *served)
        _check_capacity(1, reply.best_of, capacity)
        max_tokens = body.max_completion_tokens or body.max_tokens
        request = openai_request(engine, body, None, messages, max_tokens, None, tools)
    return Prepared((request,), reply, tools)


def completions(
    engine: Engine, body: p.CompletionRequest, served: tuple[str, Sequence[str]], capacity: int
) -> Prepared[OpenAIReply]:
    """A /v1/completions request, translated once: one engine request per prompt (each asked
    best_of times, the n best answered), and its reply; as `chat` does."""
    n, best_of = body.n or 1, body.best_of or body.n or 1
    if best_of < n:
        raise APIError(400, f"best_of ({best_of}) must be at least n ({n})", param="best_of", code="invalid_value")
    if best_of > n and body.stream:
        why = "best_of > n cannot be streamed (the best are known at the end)"
        raise APIError(400, why, param="best_of", code="invalid_value")
    reply = _openai_reply(body, "prompt", best_of)
    with refusals(reply.prompt_param, reply.constraint_param):
        check_model(body, *served)
        items = choices.prompts(body.prompt, engine.target.vocab_size)
        _check_capacity(len(items), best_of, capacity)
        requests = tuple(
            openai_request(engine, body, item, None, body.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS) for item in items
        )
    return Prepared(requests, reply)


def _openai_reply(body: p._GenerationRequest, prompt_param: str, best_of: int) -> OpenAIReply:
    completion = isinstance(body, p.CompletionRequest)
    if completion:
        logprobs = body.logprobs
    else:  # chat's logprobs: a flag, and top_logprobs the alternatives
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
    return OpenAIReply(
        stream=bool(body.stream),
        constraint_param=constraint_param(body),
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        n=body.n or 1,
        best_of=best_of,
        echo=completion and bool(body.echo),
        logprobs=logprobs,
        prompt_param=prompt_param,
    )


@contextmanager
def refusals(prompt_param: str, constraint_param: str | None) -> Iterator[None]:
    """A library error raised inside (while a request is translated or queued) as the APIError
    of errors.openai_refusal, naming the request's prompt or constraint field; any other error
    as it is."""
    try:
        yield
    except Exception as exc:
        error = openai_refusal(exc, param=prompt_param, constraint_param=constraint_param)
        if error is None:
            raise
        raise error from None


def _check_capacity(num_prompts: int, per_prompt: int, capacity: int) -> None:
    """More choices than the server can ever hold at once would meet a full queue (503) even on an
    idle server: that request can never be served, so it is a 400 before anything is queued."""
    if num_prompts * per_prompt > capacity:
        raise APIError(
            400,
            f"the request asks for {num_prompts * per_prompt} choices ({num_prompts} prompt(s) x {per_prompt}); "
            f"this server holds at most {capacity} at once (--max-queue plus its slots)",
            param="n",
            code="too_many_choices",
        )


def openai_request(
    engine: Engine,
    body: p._GenerationRequest,
    prompt: tuple[str | None, list[int] | None] | None,
    messages: list[dict] | None,
    max_tokens: int | None,
    default_max_tokens: int | None,
    tools: ChatTools | None = None,
) -> EngineRequest:
    """A chat request (messages) or one prompt of a completions request (text or ids) as the
    engine's request. max_tokens None: up to default_max_tokens, or the rest of the context."""
    text, prompt_ids = (None, None) if messages is not None else prompt
    suffix = body.suffix if isinstance(body, p.CompletionRequest) else None
    if suffix:  # fill in the middle: the prompt is the text before the gap, the suffix the text after
        prompt_ids = _fim_ids(engine, text, suffix)
    elif prompt_ids is None:
        prompt_ids = engine.encode_prompt(text, messages, tools.rendered if tools else None)
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
    limit = max_tokens if max_tokens is not None else min(default_max_tokens or n_ctx, max(1, n_ctx - len(prompt_ids)))
    config, drafters = speculation(body.speculation, engine.speculation)
    sources = bool(body.speculation and body.speculation.sources)
    return EngineRequest(
        prompt_ids, _openai_sampling(body, limit, constraint), config, drafters, _prediction(body), sources
    )


def chat_messages(body: p.ChatCompletionRequest) -> list[dict[str, Any]]:
    """The request's messages as chat templates take them (text only; "developer" is "system")."""
    return [_message_dict(i, m) for i, m in enumerate(body.messages)]


def constraint_param(body: p._GenerationRequest) -> str:
    """The field a constraint that fails while decoding came from."""
    if isinstance(body, p.ChatCompletionRequest) and body.tools:
        return "tools"
    return "grammar" if body.grammar is not None else "regex" if body.regex is not None else "response_format"


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


def _openai_sampling(body: p._GenerationRequest, max_tokens: int, constraint: Constraint | None) -> SamplingParams:
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
        logit_bias=_openai_logit_bias(body.logit_bias),
        **_logprobs(body),
    )


def _openai_logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
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
    assert isinstance(body, p.CompletionRequest)
    num = body.logprobs
    return {"logprobs": num, "prompt_logprobs": num if body.echo else None}


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


# ---------------------------------------------------------------------- shared by every protocol
def speculation(
    options: p.SpeculationOptions | None, base: SpeculationConfig
) -> tuple[SpeculationConfig | None, list[str] | None]:
    """The request's speculation override (draftwise's extension) over the server's settings;
    (None, None): the server's own."""
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


# ---------------------------------------------------------------------- llama.cpp: /infill
_NO_FIM = (
    "this model has no fill-in-the-middle tokens (prefix, suffix and middle); /infill needs a "
    "FIM-trained model such as Qwen2.5-Coder"
)


@dataclasses.dataclass(frozen=True)
class InfillReply(Reply):
    """How an /infill request is answered: its completions (n_cmpl; one for a warm-up, n_predict
    0), the room the context leaves for each, llama.cpp's cuts (n_indent, t_max_predict_ms) and
    what its answer objects carry."""

    copies: int = 1
    room: int = 0
    n_predict: int = -1
    n_indent: int = 0
    t_max_predict_ms: int = 0
    samplers: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_SAMPLERS))
    return_tokens: bool = False
    response_fields: list[str] | None = None

    @property
    def warmup(self) -> bool:
        """n_predict 0: one token, only to fill the cache; the answer has no text."""
        return self.n_predict == 0


def infill(engine: Engine, body: InfillRequest, tokens: FimTokens | None) -> Prepared[InfillReply]:
    """An /infill request, translated once (tokens: the model's FIM tokens, None where it has
    none): its fill-in-the-middle prompt and sampling, and its reply. It tokenises: routes run it
    in a worker thread."""
    field = body.unsupported()
    if field is not None:
        raise APIError(400, f"{field} is not supported by this server", param=field, code="unsupported_parameter")
    if tokens is None:
        raise APIError(400, str(FimUnsupportedError(_NO_FIM)), code="fim_unsupported")
    request, room = infill_request(engine, body, tokens)
    reply = InfillReply(
        stream=body.stream,
        copies=1 if body.n_predict == 0 else body.n_cmpl,
        room=room,
        n_predict=body.n_predict,
        n_indent=body.n_indent,
        t_max_predict_ms=body.t_max_predict_ms,
        samplers=body.samplers or list(DEFAULT_SAMPLERS),
        return_tokens=body.return_tokens,
        response_fields=body.response_fields,
    )
    return Prepared((request,), reply)


def infill_request(engine: Engine, body: InfillRequest, tokens: FimTokens) -> tuple[EngineRequest, int]:
    """An /infill request as the engine's request, and the room its context leaves for the answer.
    n_predict 0 (a warm-up): one token, drafting nothing, only to fill the cache."""
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
    sampling = infill_sampling(body, max_tokens, engine.tokenizer, engine.target.vocab_size)
    config, drafters = speculation(body.speculation, engine.speculation)
    if body.n_predict == 0:
        config, drafters = dataclasses.replace(config or engine.speculation, enabled=False), None
    return EngineRequest(built.ids, sampling, config, drafters), room


def infill_logit_bias(value: Any, tokenizer, vocab_size: int) -> tuple[tuple[int, float], ...]:
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
        logit_bias=infill_logit_bias(body.logit_bias, tokenizer, vocab_size) if body.logit_bias else (),
        seed=None if body.seed < 0 else body.seed % 2**64,
        max_tokens=max_tokens,
        stop=tuple(body.stop),
        ignore_eos=body.ignore_eos,
    )
