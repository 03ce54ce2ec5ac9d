"""OpenAI's Responses API wire schema (pydantic): the /v1/responses request and its input items,
as openai-python's types/responses define them, and `ResponseStore`, the stored responses that
`previous_response_id` and GET/DELETE /v1/responses/{id} read (per API key, the newest kept).

Requests ignore unknown fields, as the other /v1 routes do; a field set to a value this server
cannot serve is refused by responses_translate.refuse_unsupported (400 naming it).
`speculation` is draftwise's extension, as on /v1/chat/completions.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from draftwise.server.fields import WireModel
from draftwise.server.protocol import SpeculationOptions

STORED_PER_KEY = 256  # stored responses kept per API key (the oldest go first)


class _Request(WireModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextFormat(_Request):
    """text.format: plain text, any JSON object, or a JSON schema (name, schema and strict inline)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Request):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(_Request):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(_Request):
    model: str
    input: str | list[dict[str, Any]] = Field(description="Text (one user message) or input items.")
    instructions: str | None = Field(None, description="A system message first (not carried to the next turn).")
    tools: list[dict[str, Any]] | None = Field(None, description="Function tools (type function, with strict).")
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2, description="Default 1.0, as OpenAI; 0 is greedy.")
    top_p: float | None = Field(None, gt=0, le=1)
    text: TextConfig | None = None
    stream: bool | None = False
    store: bool | None = Field(None, description="Default true: kept for previous_response_id and GET.")
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    reasoning: Reasoning | None = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    user: str | None = None
    speculation: SpeculationOptions | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


# ---------------------------------------------------------------------- stored responses
@dataclass(frozen=True)
class Stored:
    """A finished response: its object as answered, and the conversation a follow-up continues
    (its input as chat messages, instructions left out, then its output as the assistant's)."""

    response: dict[str, Any]
    conversation: tuple[dict[str, Any], ...]


class ResponseStore:
    """Stored responses per tenant (API key), the newest STORED_PER_KEY of each; a tenant never
    reads another's (get answers None, as for an id never stored)."""

    def __init__(self, per_key: int = STORED_PER_KEY) -> None:
        self.per_key = per_key
        self._by_tenant: dict[int | None, OrderedDict[str, Stored]] = {}

    def put(self, tenant: int | None, stored: Stored) -> None:
        kept = self._by_tenant.setdefault(tenant, OrderedDict())
        kept[stored.response["id"]] = stored
        while len(kept) > self.per_key:
            kept.popitem(last=False)

    def get(self, tenant: int | None, response_id: str) -> Stored | None:
        return self._by_tenant.get(tenant, {}).get(response_id)

    def delete(self, tenant: int | None, response_id: str) -> bool:
        return self._by_tenant.get(tenant, {}).pop(response_id, None) is not None


NAMESPACE_SEP = "__"  # a namespace's function as the model sees it: "{namespace}__{name}"


def qualified(name: str, namespace: str | None) -> str:
    return f"{namespace}{NAMESPACE_SEP}{name}" if namespace else name


def split_name(name: str, namespaces: frozenset[str]) -> tuple[str, str | None]:
    """A called name -> (name, namespace): "crm__find" -> ("find", "crm") when crm is a namespace."""
    head, sep, tail = name.partition(NAMESPACE_SEP)
    return (tail, head) if sep and head in namespaces else (name, None)


def namespaces(tools: list[dict[str, Any]] | None) -> frozenset[str]:
    return frozenset(t["name"] for t in tools or () if t.get("type") == "namespace")
