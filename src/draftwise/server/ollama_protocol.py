"""Ollama's wire schemas (pydantic): /api/chat and /api/generate requests, their messages and
tool calls, /api/show and /api/pull, as Ollama's docs/api.md and api/types.go define them.

Requests ignore unknown fields, as Ollama does; a string where a number belongs is a 400.
`options` stays a mapping here: ollama_requests reads it as Ollama's Options.FromMap does.
`speculation` is the draftwise extension of the OpenAI routes (Ollama clients never send it).
Model names are `name:tag`; the tag is optional and defaults to `latest`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from draftwise.server.fields import WireModel
from draftwise.server.protocol import SpeculationOptions


def base_name(name: str) -> str:
    """A model name without Ollama's default tag. Example: "toy-40:latest" -> "toy-40"."""
    return name[: -len(":latest")] if name.endswith(":latest") else name


def tagged(name: str) -> str:
    """The name as Ollama lists it, with a tag. Example: "toy-40" -> "toy-40:latest"."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


class _Request(WireModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class ToolCallFunction(_Request):
    name: str
    # Ollama's arguments are a JSON object; a JSON text (OpenAI's form) is read as one.
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    index: int | None = None


class ToolCall(_Request):
    id: str | None = None
    function: ToolCallFunction


class Message(_Request):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    thinking: str | None = None
    images: list[Any] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = Field(None, description="The tool whose result a tool message holds.")
    tool_call_id: str | None = None

    @field_validator("role", mode="before")
    @classmethod
    def _lower(cls, role: Any) -> Any:
        return role.lower() if isinstance(role, str) else role  # Ollama lower-cases roles


class _GenerationRequest(_Request):
    """Fields shared by /api/chat and /api/generate."""

    model: Annotated[str, Field(min_length=1)]
    stream: bool | None = Field(None, description="Default true: NDJSON, one object per line.")
    format: str | dict[str, Any] | None = Field(None, description='"json" or a JSON schema.')
    options: dict[str, Any] | None = None
    keep_alive: str | int | float | None = Field(
        None,
        description='How long the model stays loaded after this request on a server of several models: "5m", '
        "300 (seconds), 0 (unload), negative or longer than 292 years (for ever). A server of one keeps its model.",
    )
    think: bool | str | None = None
    truncate: bool | None = None
    shift: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    speculation: SpeculationOptions | None = None

    @property
    def streamed(self) -> bool:
        return self.stream is not False


class ChatRequest(_GenerationRequest):
    messages: list[Message] | None = None
    tools: list[dict[str, Any]] | None = None


class GenerateRequest(_GenerationRequest):
    prompt: str | None = ""
    suffix: str | None = ""
    system: str | None = ""
    template: str | None = ""
    raw: bool | None = False
    context: list[int] | None = None
    images: list[Any] | None = None


class ShowRequest(_Request):
    model: str | None = ""
    name: str | None = ""  # the field's older name
    verbose: bool | None = False


class PullRequest(_Request):
    model: str | None = ""
    name: str | None = ""
    insecure: bool | None = False
    stream: bool | None = None


# ---------------------------------------------------------------------- responses
class ModelDetails(BaseModel):
    parent_model: str = ""
    format: str
    family: str
    families: list[str]
    parameter_size: str
    quantization_level: str


class ListedModel(BaseModel):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: ModelDetails
    aliases: list[str] = Field(default_factory=list, description="draftwise: the other names the model answers to.")


class RunningModel(BaseModel):
    name: str
    model: str
    size: int
    digest: str
    details: ModelDetails
    expires_at: str
    size_vram: int
    context_length: int


class ShowResponse(BaseModel):
    modelfile: str
    parameters: str
    template: str
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class Version(BaseModel):
    version: str


class ErrorResponse(BaseModel):
    error: str
