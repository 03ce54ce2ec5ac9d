"""llama.cpp's /tokenize and /detokenize, also in vLLM's names, and vLLM's /tokenizer_info, so
that clients such as lm-eval tokenise through the server with the model's own tokenizer.

POST /tokenize {content, add_special, with_pieces} -> {tokens} (with_pieces: [{id, piece}]);
POST /detokenize {tokens} -> {content, prompt}; GET /tokenizer_info -> {eos_token, ...}.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from pydantic import ConfigDict, Field

from draftwise.server.errors import ERROR_STATUSES, APIError
from draftwise.server.fields import WireModel
from draftwise.server.state import State

router = APIRouter()


class TokenizeRequest(WireModel):
    """llama.cpp's fields; vLLM's (`prompt`, `add_special_tokens`, as lm-eval's remote tokenizer sends) too."""

    model_config = ConfigDict(strict=True, extra="ignore")
    content: str | None = None
    prompt: str | None = None
    add_special: bool | None = None
    add_special_tokens: bool | None = None
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(WireModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    tokens: list[int] = Field(default_factory=list)


@router.post("/tokenize", tags=["llama.cpp"], responses=ERROR_STATUSES)
async def tokenize(body: TokenizeRequest, state: State) -> dict:
    tokenizer = state.engine.tokenizer
    text = body.content if body.content is not None else body.prompt
    if text is None:
        raise APIError(400, "give the text to tokenise as content", param="content", code="invalid_value")
    special = body.add_special if body.add_special is not None else bool(body.add_special_tokens)
    ids = await asyncio.to_thread(tokenizer.encode, text, add_special=special, parse_special=body.parse_special)
    if not body.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": t, "piece": tokenizer.decode([t])} for t in ids]}


@router.post("/detokenize", tags=["llama.cpp"], responses=ERROR_STATUSES)
async def detokenize(body: DetokenizeRequest, state: State) -> dict:
    vocab_size = state.engine.target.vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise APIError(
            400,
            f"token id {bad} is outside the vocabulary (size {vocab_size})",
            param="tokens",
            code="invalid_value",
        )
    text = await asyncio.to_thread(state.engine.tokenizer.decode, body.tokens)
    return {"content": text, "prompt": text}


@router.get("/tokenizer_info", tags=["vllm"])
async def tokenizer_info(state: State) -> dict:
    tokenizer = state.engine.tokenizer
    eos = min(tokenizer.eos_token_ids) if tokenizer.eos_token_ids else None
    return {"eos_token": None if eos is None else tokenizer.token_text(eos), "bos_token": None, "pad_token": None}
