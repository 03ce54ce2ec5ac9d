"""Ollama's requests -> the engine's request (translate.EngineRequest), beside translate.py's
OpenAI and llama.cpp translators: model names as Ollama clients send them, `options` read as
Ollama's Options.FromMap reads them (then SamplingParams), `format` as a Constraint, chat and
generate prompts as chat-template messages (tools and tool results included), and
/api/generate's `suffix` as the fill-in-the-middle prompt of /v1/completions.

Every refusal is an APIError (400, or 404 for a model this server does not serve) whose
message names the field, as Ollama's own errors do.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from draftwise.constraints import Constraint, llguidance_tokenizer
from draftwise.engine import Engine
from draftwise.fim import FimUnsupportedError, fim_prompt
from draftwise.server import names as model_names
from draftwise.server.errors import APIError
from draftwise.server.fields import FINITE_RULE, INT64_RULE, int64
from draftwise.server.keep_alive import keep_alive_seconds
from draftwise.server.ollama_protocol import ChatRequest, GenerateRequest, Message, tagged
from draftwise.server.prepared import EngineRequest, Prepared, Reply
from draftwise.server.tools import ChatTools, enforceable
from draftwise.server.translate import refusals, speculation
from draftwise.tools import ToolChoice, parse_tools, template_messages, tool_plan
from draftwise.tools.spec import ToolSpecError
from draftwise.types import SamplingParams


@dataclasses.dataclass(frozen=True)
class OllamaReply(Reply):
    """How an /api/chat or /api/generate request is answered: the model name its chunks repeat
    (as the client sent it), and for a request without a prompt (Ollama's way to load a model)
    the done_reason of its one object ("unload" when keep_alive is 0); prompt_param: the field a
    refused prompt names."""

    model: str = ""
    load_reason: str = "load"
    prompt_param: str = "messages"


def chat(engine: Engine, body: ChatRequest, served: tuple[str, Sequence[str]]) -> Prepared[OllamaReply]:
    """An /api/chat request, translated once: its prompt (messages and tools through the chat
    template), sampling and reply; no engine request for a load (no messages). It tokenises:
    routes run it in a worker thread."""
    reply = _reply(body, served)
    if not body.messages:
        return Prepared((), reply)
    constraint = format_constraint(body.format)
    tools, messages = chat_tools(body.tools, engine.tokenizer, chat_messages(body.messages), constraint is not None)
    request = ollama_request(
        engine,
        body,
        lambda: engine.encode_prompt(None, messages, tools.rendered if tools else None),
        tools.plan.constraint if tools else constraint,
        reply,
    )
    return Prepared((request,), reply, tools)


def generate(engine: Engine, body: GenerateRequest, served: tuple[str, Sequence[str]]) -> Prepared[OllamaReply]:
    """An /api/generate request, translated once (as `chat`): the prompt through the chat template,
    verbatim (raw), or as fill in the middle (suffix); no engine request for a load (no prompt)."""
    reply = _reply(body, served)
    prompt, suffix = body.prompt or "", body.suffix or ""
    if not prompt and not suffix:
        return Prepared((), reply)
    if suffix:  # fill in the middle: the prompt is the text before the gap
        encode = lambda: fim_ids(engine.tokenizer, prompt, suffix)  # noqa: E731
    elif body.raw:  # the prompt verbatim
        encode = lambda: engine.encode_prompt(prompt)  # noqa: E731
    else:
        messages = generate_messages(body)
        encode = lambda: engine.encode_prompt(None, messages)  # noqa: E731
    return Prepared((ollama_request(engine, body, encode, format_constraint(body.format), reply),), reply)


def _reply(body: ChatRequest | GenerateRequest, served: tuple[str, Sequence[str]]) -> OllamaReply:
    """The model checked, the fields this server cannot honour refused, then the reply."""
    check_model(body.model, *served)
    refuse_unsupported(body)
    return OllamaReply(
        stream=body.streamed,
        constraint_param=constraint_param(body),
        model=body.model,
        load_reason="unload" if keep_alive_seconds(body.keep_alive) == 0 else "load",
        prompt_param="messages" if isinstance(body, ChatRequest) else "prompt",
    )


def ollama_request(
    engine: Engine,
    body: ChatRequest | GenerateRequest,
    encode: Callable[[], list[int]],
    constraint: Constraint | None,
    reply: OllamaReply,
) -> EngineRequest:
    """A chat or generate request as the engine's request: the prompt ids `encode` gives, an answer
    sized by num_predict within the context, the options' sampling under `constraint`; a library
    error is the APIError of errors.openai_refusal, naming the reply's prompt or constraint field."""
    options = parse_options(body.options, engine.target.n_ctx)
    with refusals(reply.prompt_param, reply.constraint_param):
        logprobs = logprobs_asked(body)
        prompt_ids = encode()
        if constraint is not None:  # the model's tokenizer adapter, built once
            llguidance_tokenizer(engine.target)
        limit = answer_budget(options, len(prompt_ids), engine.target.n_ctx)
        config, drafters = speculation(body.speculation, engine.speculation)
        return EngineRequest(prompt_ids, sampling(options, limit, constraint, logprobs), config, drafters)


# Ollama's DefaultOptions (api/types.go) for the options that shape the answer.
DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P = 0.8, 40, 0.9

# Options.FromMap's types: an integer option takes any JSON number (truncated), the others their kind.
_INT, _FLOAT, _BOOL, _LIST = "integer", "float32", "boolean", "array"
_KINDS = {
    **dict.fromkeys(
        (
            "num_keep",
            "seed",
            "num_predict",
            "top_k",
            "repeat_last_n",
            "num_ctx",
            "num_batch",
            "num_gpu",
            "main_gpu",
            "num_thread",
            "draft_num_predict",
            "mirostat",
        ),
        _INT,
    ),
    **dict.fromkeys(
        (
            "top_p",
            "min_p",
            "typical_p",
            "temperature",
            "repeat_penalty",
            "presence_penalty",
            "frequency_penalty",
            "tfs_z",
            "mirostat_tau",
            "mirostat_eta",
        ),
        _FLOAT,
    ),
    **dict.fromkeys(
        ("use_mmap", "numa", "penalize_newline", "low_vram", "f16_kv", "vocab_only", "use_mlock", "logits_all"), _BOOL
    ),
    "stop": _LIST,
}
# Samplers draftwise does not apply, with the value that leaves them off (older Ollama releases
# and llama.cpp took them; any other value would change the answer, so it is refused).
_NEUTRAL = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0}
# The float options with a range (Ollama's samplers clamp these; a value outside is refused
# here, as the answer would not be what the client asked for): (low, high), both included.
_RANGES = {"temperature": (0.0, math.inf), "top_p": (0.0, 1.0), "min_p": (0.0, 1.0)}


@dataclasses.dataclass(frozen=True)
class Options:
    """The options of a request that shape its answer, at Ollama's defaults when not given.
    num_predict <= 0: until the context is full; num_ctx 0: the server's window."""

    num_predict: int = -1
    num_ctx: int = 0
    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    min_p: float = 0.0
    seed: int = -1
    stop: tuple[str, ...] = ()
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


def parse_options(raw: dict[str, Any] | None, n_ctx: int) -> Options:
    """`options` -> Options: unknown names are ignored (as Ollama does), a value of the wrong type is
    a 400 in Ollama's words, and so is a number that is not finite, an integer beyond 64 bits, a
    temperature below 0 or a top_p or min_p outside [0, 1], a sampler draftwise does not apply set
    to anything but off, and a num_ctx above the server's window.

    Example: ({"temperature": 0, "num_predict": 8.0, "numa": True}, 4096) -> Options(num_predict=8, temperature=0.0).
    """
    values: dict[str, Any] = {}
    for key, value in (raw or {}).items():
        kind = _KINDS.get(key)
        if kind is None or value is None:
            continue
        values[key] = _typed(key, value, kind)
    for name, (low, high) in _RANGES.items():
        if name in values and not low <= values[name] <= high:
            within = f"at least {low:g}" if high == math.inf else f"between {low:g} and {high:g}"
            raise APIError(
                400,
                f"must be {within}, got {values[name]:g}",
                param=f"options.{name}",
                code="invalid_value",
            )
    for name, neutral in _NEUTRAL.items():
        if name in values and values[name] != neutral:
            raise APIError(
                400,
                f"option {name!r} is not supported by this server (draftwise does not apply that sampler); "
                f"leave it out or set it to {neutral:g}",
                param=f"options.{name}",
                code="unsupported_parameter",
            )
    penalties = (
        values.get("repeat_penalty", 1.0) != 1.0
        or values.get("presence_penalty", 0.0)
        or values.get("frequency_penalty", 0.0)
    )
    if values.get("penalize_newline") is False and penalties:
        raise APIError(
            400,
            "option 'penalize_newline': false is not supported by this server (its penalties apply to every "
            "token, newlines included); leave it out or set it to true",
            param="options.penalize_newline",
            code="unsupported_parameter",
        )
    num_ctx = values.get("num_ctx", 0)
    if num_ctx > n_ctx:
        raise APIError(
            400,
            f"option 'num_ctx' is {num_ctx}, but this server's context window holds {n_ctx} tokens; "
            f"set num_ctx to {n_ctx} or less (or leave it out)",
            param="options.num_ctx",
            code="context_length_exceeded",
        )
    if "stop" in values:
        values["stop"] = tuple(s for s in values["stop"] if s)
    known = {f.name for f in dataclasses.fields(Options)}
    return Options(**{k: v for k, v in values.items() if k in known})


def _typed(key: str, value: Any, kind: str) -> Any:
    """One option's value as Options.FromMap takes it (a JSON number for an integer: truncated),
    finite, and an integer within 64 bits (Go's int)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(value, float) and not math.isfinite(value):
        raise APIError(400, FINITE_RULE, param=f"options.{key}", code="invalid_value")
    if kind == _INT and number:
        if not int64(int(value)):
            raise APIError(400, INT64_RULE, param=f"options.{key}", code="invalid_value")
        return int(value)
    if kind == _FLOAT and number:
        return float(value)
    if kind == _BOOL and isinstance(value, bool):
        return value
    if kind == _LIST and isinstance(value, str):
        return (value,)
    if kind == _LIST and isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise APIError(400, f"option {key!r} must be of type {kind}", param=f"options.{key}", code="invalid_value")


def sampling(
    options: Options, max_tokens: int, constraint: Constraint | None = None, logprobs: int | None = None
) -> SamplingParams:
    """Options as SamplingParams, each sampler off where Ollama's is (top_k <= 0, top_p 0 or 1,
    min_p 0 or 1, repeat_penalty <= 0); temperature 0 is greedy, a negative seed random.

    NOTE: presence and frequency penalties count the answer's tokens (OpenAI's definition, as on
    /v1/chat/completions); Ollama's runners count the last repeat_last_n tokens for them too."""
    return SamplingParams(
        temperature=max(0.0, options.temperature),
        top_k=max(0, options.top_k),
        top_p=options.top_p if 0 < options.top_p < 1 else 1.0,
        min_p=0.0 if options.min_p <= 0 or options.min_p > 1 else options.min_p,
        seed=None if options.seed < 0 else options.seed % 2**64,
        max_tokens=max_tokens,
        stop=options.stop,
        constraint=constraint,
        repeat_penalty=options.repeat_penalty if options.repeat_penalty > 0 else 1.0,
        repeat_last_n=options.repeat_last_n,
        presence_penalty=options.presence_penalty,
        frequency_penalty=options.frequency_penalty,
        logprobs=logprobs,
    )


def answer_budget(options: Options, num_prompt: int, n_ctx: int) -> int:
    """Tokens the answer may take: num_predict, within the context (num_ctx when given, else the
    server's window) that the prompt leaves; a prompt that fills the context is a 400."""
    window = options.num_ctx or n_ctx
    if num_prompt >= window:
        where = f"num_ctx ({window})" if options.num_ctx else f"this server's context window ({window} tokens)"
        raise APIError(
            400,
            f"the prompt has {num_prompt} tokens, which does not leave room for an answer in {where}; "
            "shorten the prompt",
            code="context_length_exceeded",
        )
    room = window - num_prompt
    return room if options.num_predict <= 0 else min(options.num_predict, room)


def format_constraint(fmt: str | dict | None) -> Constraint | None:
    """`format`: "json" -> any JSON object, a JSON schema -> that schema, "" or none -> free text."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return Constraint.json_object()
    if isinstance(fmt, dict):
        return Constraint.json_schema(fmt)
    raise APIError(
        400, f'format must be "json" or a JSON schema (an object), got {fmt!r}', param="format", code="invalid_value"
    )


def constraint_param(body: ChatRequest | GenerateRequest) -> str:
    """The field a request's constraint came from: its tools, else its format."""
    return "tools" if isinstance(body, ChatRequest) and body.tools else "format"


def logprobs_asked(body: ChatRequest | GenerateRequest) -> int | None:
    """SamplingParams.logprobs for `logprobs` and `top_logprobs` (None: not asked)."""
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
    return (body.top_logprobs or 0) if body.logprobs else None


# ---------------------------------------------------------------------- names and refusals
def check_model(requested: str | None, served: str, names: Sequence[str] = ()) -> None:
    """404 in Ollama's words unless `requested` names the served model (any of its names, see
    server/names.py; its tag :latest or none)."""
    if not model_names.answers_to(requested, served, names):
        raise APIError(
            404,
            f"model {model_names.quoted(requested or '')} not found; this server serves '{tagged(served)}'",
            param="model",
            code="model_not_found",
        )


def refuse_unsupported(body: ChatRequest | GenerateRequest) -> None:
    """Fields that would change the answer and that this server cannot honour: a 400 naming them."""
    if body.think not in (None, False):
        raise APIError(400, f"{body.model!r} does not support thinking", param="think", code="unsupported_parameter")
    images = bool(body.images) if isinstance(body, GenerateRequest) else any(m.images for m in body.messages or ())
    if images:
        raise APIError(
            400,
            "images are not supported by this server: draftwise serves text-only models",
            param="images",
            code="unsupported_parameter",
        )
    if isinstance(body, GenerateRequest):
        if body.template:
            raise APIError(
                400,
                "template is not supported by this server: prompts use the model's own chat template "
                "(send raw: true with a prompt already laid out in the template instead)",
                param="template",
                code="unsupported_parameter",
            )
        if body.context:
            raise APIError(
                400,
                "context (deprecated in Ollama) is not supported by this server; send the conversation "
                "as /api/chat messages",
                param="context",
                code="unsupported_parameter",
            )
        if body.raw and body.system:
            raise APIError(400, "raw mode does not support template, system, or context", param="system")


# ---------------------------------------------------------------------- prompts
def chat_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Ollama's messages -> the OpenAI-shaped dicts chat templates read (draftwise.tools.template_messages).

    An assistant's tool call without an id gets one; a tool message answers the first unanswered
    call of the assistant message before it with its tool_name (or, without one, the first unanswered
    call), as Ollama pairs them by order.
    Example: [assistant calls f, tool (tool_name f)] -> the tool message with tool_call_id "call_0_0".
    """
    out: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (id, name) of the last assistant message's calls
    for i, message in enumerate(messages):
        item: dict[str, Any] = {"role": message.role, "content": message.content or ""}
        if message.role == "assistant" and message.tool_calls:
            calls = []
            for j, call in enumerate(message.tool_calls):
                arguments = call.function.arguments
                calls.append(
                    {
                        "id": call.id or f"call_{i}_{j}",
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                        },
                    }
                )
            item["tool_calls"] = calls
            unanswered = [(c["id"], c["function"]["name"]) for c in calls]
        elif message.role == "tool":
            ids = [call_id for call_id, _ in unanswered]
            call_id = message.tool_call_id if message.tool_call_id in ids else None
            if call_id is None:
                named = [call_id for call_id, name in unanswered if name == message.tool_name]
                call_id = (named or ids or [message.tool_call_id])[0]
            unanswered = [(c, n) for c, n in unanswered if c != call_id]
            item["tool_call_id"] = call_id
            if message.tool_name:
                item["name"] = message.tool_name
        elif message.role == "user":
            unanswered = []
        out.append(item)
    return out


def generate_messages(body: GenerateRequest) -> list[dict[str, Any]]:
    """A /api/generate prompt (and system) as the chat the model's template lays out."""
    system = [{"role": "system", "content": body.system}] if body.system else []
    return [*system, {"role": "user", "content": body.prompt or ""}]


def chat_tools(
    tools: list[dict] | None, tokenizer, messages: list[dict], constrained: bool
) -> tuple[ChatTools | None, list[dict]]:
    """The request's tools as the plan the engine decodes under (calls free to come or not, as
    many as the model writes: Ollama has no tool_choice), and the messages as templates read them."""
    try:
        messages = template_messages(messages)
        if not tools:
            return None, messages
        if constrained:
            raise ToolSpecError("give tools or format, not both", "format")
        parsed = enforceable(parse_tools(tools))
        plan = tool_plan(tokenizer, parsed, ToolChoice("auto"), True)
    except ToolSpecError as exc:
        message = str(exc) if exc.param in str(exc) else f"{exc.param}: {exc}"
        raise APIError(400, message, param=exc.param, code="invalid_value") from None
    return ChatTools(plan, [t.as_openai() for t in parsed]), plan.messages(messages)


def fim_ids(tokenizer, prefix: str, suffix: str) -> list[int]:
    """/api/generate with a suffix: the model's single-file fill-in-the-middle prompt (as /v1/completions)."""
    try:
        return fim_prompt(tokenizer, prefix, suffix, repo_level=False).ids
    except FimUnsupportedError as exc:
        raise APIError(400, f"this model does not support insert (suffix): {exc}", param="suffix") from None
