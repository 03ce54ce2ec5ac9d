"""A request after its translation: what the engine runs (`EngineRequest`, one per prompt) and
how the request is answered (a `Reply`), built once from the body by its protocol's translator
(translate.py, <p>_translate.py). Routes queue the one and hand the other to the answers, the
streams and the error code, which never read the body again.
"""

from __future__ import annotations

import dataclasses
from typing import Generic, TypeVar

from draftwise.server import choices
from draftwise.server.tools import ChatTools
from draftwise.types import SamplingParams, SpeculationConfig


@dataclasses.dataclass(frozen=True)
class EngineRequest:
    """A request as the engine takes it (Serving.submit's arguments after the job)."""

    prompt_ids: list[int]
    sampling: SamplingParams
    speculation: SpeculationConfig | None = None
    drafters: list[str] | None = None
    prediction: str | None = None
    token_sources: bool = False  # the request asks where each token came from

    def choice(self, copy: int, *, ranked: bool = False) -> EngineRequest:
        """The request of choice `copy` (its own seed, see choices.choice_seed); ranked: its
        logprobs are kept, as completions' best_of ranks candidates by them."""
        sampling = dataclasses.replace(self.sampling, seed=choices.choice_seed(self.sampling.seed, copy))
        if ranked and sampling.logprobs is None:
            sampling = dataclasses.replace(sampling, logprobs=0)
        return dataclasses.replace(self, sampling=sampling)


@dataclasses.dataclass(frozen=True)
class Reply:
    """How a request is answered, every protocol's part: whole or streamed, and the field a
    constraint came from (a constraint that fails while decoding is a 400 naming it). Each
    protocol's reply adds its own fields (translate.OpenAIReply, responses_translate.ResponsesReply, ...)."""

    stream: bool = False
    constraint_param: str | None = None


ReplyT = TypeVar("ReplyT", bound=Reply)


@dataclasses.dataclass(frozen=True)
class Prepared(Generic[ReplyT]):
    """A request translated once: the engine's request of each prompt, how it is answered, and
    its tools (their parsers follow each choice's answer, so the answer owns them from here)."""

    requests: tuple[EngineRequest, ...]
    reply: ReplyT
    tools: ChatTools | None = None
