"""llama.cpp's wire schema for /infill (tools/server/README.md, "POST /infill" and "POST /completion")
and its sampler names, as the llama.vim and llama.vscode plugins send them.

Requests are strict and ignore unknown fields, as OpenAI's are (protocol.py).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field

from draftwise.server import protocol as p
from draftwise.server.fields import WireModel

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
MAX_COMPLETIONS = 16  # n_cmpl's bound (llama.cpp's is its slot count; more queue here)


class InfillChunk(WireModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    text: str
    filename: str = "tmp"


class InfillRequest(WireModel):
    """llama.cpp's /infill body. Unknown fields are ignored; fields that would change the answer
    and are not supported here are refused by `unsupported()`."""

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
        for name, value, default in (
            ("dry_multiplier", self.dry_multiplier, 0.0),
            ("xtc_probability", self.xtc_probability, 0.0),
            ("typical_p", self.typical_p, 1.0),
            ("dynatemp_range", self.dynatemp_range, 0.0),
            ("mirostat", self.mirostat, 0),
            ("min_keep", self.min_keep, 0),
            ("n_probs", self.n_probs, 0),
        ):
            if value != default:
                return name
        if self.top_n_sigma > 0:
            return "top_n_sigma"
        for name, value in (("grammar", self.grammar), ("json_schema", self.json_schema), ("lora", self.lora)):
            if value:
                return name
        for name in self.samplers or ():
            if name not in KNOWN_SAMPLERS or name == "adaptive_p":
                return "samplers"
        return None
