"""Anthropic's Messages wire schemas (pydantic): the /v1/messages and /v1/messages/count_tokens
requests, their content blocks, tools and tool_choice, as anthropic's API reference defines them.

A block is one model with every block type's fields, its `type` checked where the prompt is
built (anthropic_translate), so a refusal names the block. Values are strict (`max_tokens: true`
is a 400, as Anthropic answers it); unknown fields are ignored, as clients (Claude Code) send
fields of newer API versions; `cache_control` on blocks is one.
`speculation` is the draftwise extension of the OpenAI routes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from draftwise.server.fields import WireModel
from draftwise.server.protocol import SpeculationOptions


class _Request(WireModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class Block(_Request):
    """A content block: text, tool_use (id, name, input), tool_result (tool_use_id, content,
    is_error), or a type draftwise refuses (image, document) or drops (thinking)."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    is_error: bool | None = None


class Message(_Request):
    # "system": a system message in the middle of the conversation (the mid-conversation-system
    # beta, which Claude Code sends: text only); it goes to the chat template where it stands.
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class Tool(_Request):
    """A client tool; one with another `type` (Anthropic's server tools: web_search_..., bash_...) is refused."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = Field(None, description="Required of a client tool (server tools have none).")
    strict: bool | None = None  # the input follows the schema exactly (OpenAI's function.strict)
    type: str | None = None


class ToolChoice(_Request):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Request):
    type: str
    budget_tokens: int | None = None


class OutputFormat(_Request):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Request):
    """format: structured output (a JSON schema the answer follows); effort is read by reasoning
    models only, and so has nothing to change here."""

    format: OutputFormat | None = None
    effort: str | None = None


class CountTokensRequest(_Request):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    speculation: SpeculationOptions | None = None


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    type: Literal["error"] = "error"
    error: ErrorDetail


class TokenCount(BaseModel):
    input_tokens: int
