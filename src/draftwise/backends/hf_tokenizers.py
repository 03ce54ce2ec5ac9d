"""The Tokenizer seam over a transformers model's tokenizer (HFTokenizer), or over bytes where a
model directory has none (ByteTokenizer), and their loading for the hf backend."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from draftwise.backends.base import BackendError

# NOTE: llama.cpp stops on every token whose text is in this list (llama-vocab.cpp, "EOG"),
# not only on the configured EOS. Mirroring it gives a transformers target and a llama.cpp
# draft of the same GGUF identical EOS sets, so the engine's tokenizer check lets them mix.
END_OF_GENERATION_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)


class HFTokenizer:
    """The Tokenizer seam over a transformers tokenizer.

    vocab_size is the logits width, which may exceed the tokenizer (Qwen pads 151665
    tokens to 151936 rows); ids past the tokenizer read as "[PAD<id>]", as in GGUF files.
    """

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self._vocab_size = vocab_size
        self._num_known = len(tokenizer)
        eos = {int(t) for t in eos_token_ids if t is not None}
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        vocab = tokenizer.get_vocab()
        eos.update(vocab[text] for text in END_OF_GENERATION_TEXTS if text in vocab)
        self.eos_token_ids = frozenset(t for t in eos if 0 <= t < vocab_size)
        self.control_texts = frozenset(t.content for t in tokenizer.added_tokens_decoder.values() if t.special)
        self._as_text = None  # the Rust tokenizer that reads special tokens as text, made on first use
        self._as_text_lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        # Special-token text ("<|im_start|>") maps to its control token unless parse_special is off;
        # other added tokens (Qwen's "<tool_call>") always do, as in llama.cpp.
        if parse_special:
            return list(self._tok.encode(text, add_special_tokens=add_special))
        from transformers import PreTrainedTokenizerFast

        if not isinstance(self._tok, PreTrainedTokenizerFast):  # a Python tokenizer takes the flag per call
            return list(self._tok.encode(text, add_special_tokens=add_special, split_special_tokens=True))
        # NOTE: for a fast tokenizer, split_special_tokens flips a flag on the shared Rust tokenizer
        # for the call, racing with other threads' encodes: a copy of its own keeps the flag set.
        with self._as_text_lock:
            if self._as_text is None:
                from tokenizers import Tokenizer as RustTokenizer

                self._as_text = RustTokenizer.from_str(self._tok.backend_tokenizer.to_str())
                self._as_text.encode_special_tokens = True
        return list(self._as_text.encode(text, add_special_tokens=add_special).ids)

    def decode(self, ids: Sequence[int]) -> str:
        # Control tokens are not rendered (llama.cpp's detokenize does the same).
        known = [int(i) for i in ids if 0 <= i < self._num_known]
        return self._tok.decode(known, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        text = self._tok.convert_ids_to_tokens(token_id) if 0 <= token_id < self._num_known else None
        return f"[PAD{token_id}]" if text is None else text

    def fim_token_ids(self) -> dict[str, int] | None:
        return None  # transformers names no FIM roles: they are found by their texts

    def llguidance_tokenizer(self, n_vocab: int):
        """llguidance's adapter over this (fast) tokenizer, padded to the logits width."""
        from llguidance.hf import from_tokenizer

        eos = self._tok.eos_token_id
        if eos is None or eos not in self.eos_token_ids:
            eos = min(self.eos_token_ids) if self.eos_token_ids else None
        return from_tokenizer(self._tok, n_vocab=n_vocab, eos_token=eos)

    @property
    def chat_template(self) -> str | None:
        template = self._tok.chat_template  # a dict (several named templates) is not one
        return template if isinstance(template, str) else None

    def apply_chat_template(
        self, messages: Sequence[dict], *, add_generation_prompt: bool = True, tools: Sequence[dict] | None = None
    ) -> str:
        if not self._tok.chat_template:
            raise BackendError("this model's tokenizer has no chat template; use a plain prompt")
        return self._tok.apply_chat_template(
            list(messages),
            tokenize=False,
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
        )


class ByteTokenizer:
    """Fallback for a model without a tokenizer: token i < 256 is byte i, no chat template.

    Example: encode("hi") -> [104, 105]; decode([104, 105, 300]) -> "hi" (300 is not a byte).
    """

    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int] = ()) -> None:
        self._vocab_size = vocab_size
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids if t is not None and 0 <= t < vocab_size)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    control_texts: frozenset[str] = frozenset()  # no text maps to a control token

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [b for b in text.encode("utf-8") if b < self._vocab_size]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256 and i not in self.eos_token_ids).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        return chr(token_id) if 0 <= token_id < 256 else f"[PAD{token_id}]"

    def fim_token_ids(self) -> dict[str, int] | None:
        return None  # bytes: no FIM tokens

    chat_template: str | None = None

    def apply_chat_template(
        self, messages: Sequence[dict], *, add_generation_prompt: bool = True, tools: Sequence[dict] | None = None
    ) -> str:
        raise BackendError("this model has no tokenizer, so no chat template; use a plain prompt or token ids")

    def llguidance_tokenizer(self, n_vocab: int):
        """Byte i for i < 256; ids above are special (never allowed by a grammar)."""
        from draftwise.constraints import lltokenizer_from_pieces

        if not self.eos_token_ids:
            raise BackendError("structured output needs an EOS token, and this model's config names none")
        pieces = [bytes([i]) if i < 256 else f"<{i}>".encode() for i in range(self._vocab_size)]
        return lltokenizer_from_pieces(
            pieces,
            eos_token_id=min(self.eos_token_ids),
            n_vocab=n_vocab,
            special_token_ids=range(256, self._vocab_size),
            encode=lambda text: [b for b in text if b < self._vocab_size],
        )


def config_eos(model) -> list[int]:
    # NOTE: a model's config names eos_token_id only where its family defines it (transformers
    # 5 dropped the attribute from PretrainedConfig): read where present. The generation config,
    # which every causal LM has, always names it (None: not set).
    generation = model.generation_config
    values = [getattr(model.config, "eos_token_id", None), generation.eos_token_id if generation else None]
    ids = [i for value in values for i in (value if isinstance(value, (list, tuple)) else [value])]
    return [int(i) for i in ids if i is not None]


def wrap_tokenizer(tokenizer, model):
    """The Tokenizer seam over a loaded model's tokenizer: transformers' wrapped, None as bytes,
    anything else (already the seam) as it is."""
    vocab_size = int(model.config.vocab_size)
    if tokenizer is None:
        return ByteTokenizer(vocab_size, config_eos(model))
    from transformers import PreTrainedTokenizerBase

    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return HFTokenizer(tokenizer, vocab_size, config_eos(model))
    return tokenizer  # already implements the Tokenizer seam


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def load_tokenizer(directory: Path, gguf_file: str | None, model):
    """The model's own tokenizer; a directory that has none gets byte-level ids."""
    from transformers import AutoTokenizer

    if gguf_file is None and not any((directory / f).is_file() for f in TOKENIZER_FILES):
        return wrap_tokenizer(None, model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
    except Exception as exc:  # the tokenizers library raises bare Exceptions
        raise BackendError(
            f"transformers could not load the tokenizer of {directory / (gguf_file or '')}: {exc}"
        ) from exc
    return wrap_tokenizer(tokenizer, model)
