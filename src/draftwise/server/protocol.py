"""OpenAI wire schemas (pydantic): chat and text completion requests, their responses and
stream chunks, the model list and the error body.

Requests are strict (a string where a number belongs is a 422, not a silent coercion) and
ignore unknown fields, as OpenAI clients send many. `response_format` is OpenAI's (text,
json_object, json_schema); `top_k`, `min_p`, `ignore_eos`, `grammar`, `regex` and
`speculation` are draftwise extensions; `usage.speculative` carries the docs/design.md section 5
metrics of the request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from draftwise.server.fields import WireModel

StopString = Annotated[str, Field(min_length=1)]


class _Request(WireModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False


class SpeculationOptions(_Request):
    """Extension: override the server's speculation settings for one request."""

    policy: Literal["auto", "fixed", "heuristic"] | None = None
    max_draft_tokens: int | None = Field(None, ge=1, le=256)
    drafters: list[str] | None = Field(None, description="Subset of the server's drafters by name, e.g. ['ngram'].")
    enabled: bool | None = None
    sources: bool | None = Field(
        None,
        description="Return where each token came from: token_sources on each choice (chat and completions), "
        "spans of text with their source (target, grammar or a drafter), step, drafted, accepted and logprob.",
    )


class ContentPart(_Request):
    type: str
    text: str | None = None


class JsonSchemaFormat(_Request):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="The JSON schema the answer follows.")
    strict: bool | None = Field(None, description="Answers always follow the schema here, strict or not.")


class ResponseFormat(_Request):
    """OpenAI's response_format: text, any JSON object, or a JSON schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class Prediction(_Request):
    """OpenAI's predicted output: text the answer is expected to largely repeat."""

    type: Literal["content"]
    content: str | Annotated[list[ContentPart], Field(min_length=1)]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ValueError(f"prediction content parts must be text, got type {part.type!r}")
        return "".join(part.text or "" for part in self.content)


class _GenerationRequest(_Request):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2, description="Default 1.0, as OpenAI; 0 is greedy.")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, description="Extension: 0 disables it.")
    min_p: float | None = Field(None, ge=0, lt=1, description="Extension: 0 disables it.")
    seed: int | None = Field(None, description="Taken modulo 2**64.")
    stop: StopString | Annotated[list[StopString], Field(max_length=16)] | None = None
    n: int | None = Field(None, ge=1, le=128, description="Independent choices per prompt (temperature 0: equal).")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2, description="Per token the answer holds (output only).")
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="Per occurrence in the answer.")
    repeat_penalty: float | None = Field(
        None,
        gt=0,
        description="Extension (llama.cpp): over the last repeat_last_n tokens, prompt included; 1 disables it.",
    )
    repeat_last_n: int | None = Field(None, ge=-1, description="Extension (llama.cpp): default 64, -1 all, 0 off.")
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        None, description="Token id (as a string) -> bias added to its logit."
    )
    user: str | None = None
    ignore_eos: bool = Field(False, description="Extension: keep generating past EOS (benchmarks).")
    speculation: SpeculationOptions | None = None
    response_format: ResponseFormat | None = None
    prediction: Prediction | None = Field(None, description="Predicted output: drafted from, never changes the answer.")
    grammar: str | None = Field(None, description="Extension: the answer follows this Lark or GBNF grammar.")
    regex: str | None = Field(None, description="Extension: the answer matches this regular expression.")

    def unsupported(self) -> str | None:
        """Name of the first field set to a value this server cannot honour, else None."""
        return None


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = Field(None, description="An assistant message's calls.")
    tool_call_id: str | None = Field(None, description="The call a tool message answers.")


class ChatCompletionRequest(_GenerationRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = Field(None, ge=1, description="Preferred over max_tokens when both are set.")
    logprobs: bool | None = Field(None, description="Each answer token's logprob (the model's raw log-softmax).")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="Alternatives per token (needs logprobs).")
    tools: list[dict[str, Any]] | None = Field(
        None, description="Function tools (see docs/tools-and-structured-output.md)."
    )
    tool_choice: str | dict[str, Any] | None = Field(
        None, description='"none", "auto" (default), "required" or {"type": "function", "function": {"name": ...}}.'
    )
    parallel_tool_calls: bool | None = Field(None, description="false: at most one call (default true).")


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(_GenerationRequest):
    prompt: str | TokenIds | Annotated[list[str], Field(min_length=1)] | Annotated[list[TokenIds], Field(min_length=1)]
    max_tokens: int | None = Field(None, ge=0, description="0: no new tokens (with echo: the prompt scored).")
    logprobs: int | None = Field(None, ge=0, le=5, description="Logprobs with this many alternatives per token.")
    echo: bool | None = Field(None, description="The prompt before the answer (with its logprobs if asked).")
    suffix: str | None = Field(
        None,
        description="Text after the completion: fill in the middle with the model's "
        "FIM tokens (a model without them answers 400).",
    )
    best_of: int | None = Field(
        None,
        ge=1,
        le=128,
        description="Candidates per prompt (>= n); the n with the highest mean token logprob are returned. "
        "Not with stream when > n. usage counts every candidate's tokens.",
    )


# ---------------------------------------------------------------------- responses
class SpeculativeUsage(BaseModel):
    """The request's metrics of docs/design.md section 5 (RequestStats.to_dict()) plus the draft model's reuse."""

    model_config = ConfigDict(extra="allow")

    num_prompt_tokens: int
    num_reused_tokens: int = Field(description="Prompt tokens whose target KV entries came from the last request.")
    num_draft_reused_tokens: int = Field(
        0,
        description="Prompt tokens the draft model's KV cache already held when it first drafted (0 if it never did).",
    )
    num_generated: int
    num_drafted: int
    num_accepted: int
    num_steps: int
    acceptance_rate: float
    mean_accepted_tokens: float
    tokens_per_step: float
    accepted_per_position: list[float]
    # None (with prefill_ms, decode_ms and draft_ms) when the slot last served another tenant:
    # those times would show how much of that tenant's prompt this request reused.
    tokens_per_second: float | None = Field(
        description="Generated tokens over decode time (prefill excluded); null after another tenant's request."
    )
    tokens_per_second_e2e: float | None = Field(
        description="Generated tokens over prefill + decode time; null after another tenant's request."
    )
    finish_reason: str


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionTokensDetails(BaseModel):
    """OpenAI's meaning: prediction tokens the answer kept (accepted) or not (rejected), counted
    over the prediction drafter's verified drafts; both are part of completion_tokens' cost."""

    reasoning_tokens: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None
    speculative: SpeculativeUsage | None = None


FinishReason = Literal["stop", "length", "tool_calls"]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChoice(BaseModel):
    model_config = ConfigDict(extra="allow")  # token_sources, when the request asks (SpeculationOptions.sources)

    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason | None
    logprobs: dict[str, Any] | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    # llama-server's per-request timings (prompt_n, prompt_ms, predicted_per_second, ...): on the
    # whole answer, and on a stream's last chunk of each choice; absent elsewhere.
    timings: dict | None = None
    system_fingerprint: str | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChunkChoice(BaseModel):
    model_config = ConfigDict(extra="allow")  # token_sources, when the request asks

    index: int = 0
    delta: ChatDelta
    finish_reason: FinishReason | None = None
    logprobs: dict[str, Any] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    # llama-server's per-request timings (prompt_n, prompt_ms, predicted_per_second, ...): on the
    # whole answer, and on a stream's last chunk of each choice; absent elsewhere.
    timings: dict | None = None
    system_fingerprint: str | None = None


class CompletionChoice(BaseModel):
    model_config = ConfigDict(extra="allow")  # token_sources, when the request asks

    index: int = 0
    text: str
    finish_reason: FinishReason | None = None
    logprobs: dict[str, Any] | None = None


class Completion(BaseModel):
    """Both the whole response and each stream chunk (OpenAI uses one shape for both)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    # llama-server's per-request timings (prompt_n, prompt_ms, predicted_per_second, ...): on the
    # whole answer, and on a stream's last chunk of each choice; absent elsewhere.
    timings: dict | None = None
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "draftwise"
    aliases: list[str] = Field(default_factory=list, description="The other names the model answers to.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    """Only `status` unless the caller may see every tenant's activity (openai_routes.health)."""

    status: Literal["ok"] = "ok"
    model: str | None = None
    queue_length: int | None = None
    running: bool | None = None
    slots: int | None = None  # requests decoded together (serve --parallel)
    active: int | None = None  # busy slots
    models: list[str] | None = None  # a server of several models: the loaded ones
