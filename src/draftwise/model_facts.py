"""What a GGUF model is, from its header alone: family, parameters, quantisation, vocabulary,
context, chat template, tool-call format, FIM tokens, and the memory it needs to run.

`facts_of(headers)` reads one model (a split model's parts together) and refuses, by a GGUFError
naming the file and the key, a header llama.cpp would not load (a count that is a float NaN, a
token list of integers, no tensors); `check_memory` refuses a model that would not fit in the
memory left before llama.cpp maps it. Estimates are bounded by the file's size (never negative).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from draftwise.backends.chat_templates import family_template
from draftwise.errors import ModelError
from draftwise.fim import FIM_TEXTS, MIDDLELESS_PREFIXES
from draftwise.gguf_header import (
    FILE_TYPES,
    TENSOR_TYPES,
    TOKENS_KEY,
    GGUFError,
    GGUFHeader,
    SkippedArray,
)
from draftwise.tools.formats import choose_format

# Texts of end-of-turn tokens, as llama.cpp looks for them when the GGUF names none.
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "<｜end▁of▁sentence｜>")
KV_BYTES = 2  # llama.cpp's default cache type, f16
# Besides the weights and the cache: llama.cpp's compute buffers and the process (measured
# ~150-300 MiB for the default pair at n_ctx 4096); a margin, not an estimate.
OVERHEAD_BYTES = 512 * 2**20


@dataclass(frozen=True)
class ModelFacts:
    gguf_name: str  # general.name, else the file's name
    architecture: str  # general.architecture: the family as llama.cpp knows it (qwen2, gemma3, llama)
    num_params: int  # elements of every tensor
    size_label: str | None  # general.size_label, as the model card says it ("1.5B": tied embeddings once)
    quantisation: str  # Q4_K_M, Q8_0, F16, ...
    size_bytes: int  # every part's file
    vocab_size: int | None
    context_length: int | None  # the trained window
    chat_template: str  # "gguf", "gemma (family default)", or "none"
    tool_format: str | None  # the tool-call format it speaks (draftwise.tools.formats; None: no chat)
    fim: dict[str, str]  # the FIM tokens' texts by role ({} without them)
    eot: str | None  # the end-of-turn token's text
    kv_bytes_per_token: int  # the KV cache per position at f16 (at most the file's size: see facts_of)
    vocabulary_id: str | None = None  # GGUFHeader.vocabulary_id: equal token lists, equal ids

    def as_json(self) -> dict:
        out = asdict(self)
        del out["vocabulary_id"]
        return out


def _arch_int(meta: dict, arch: str, key: str) -> int | None:
    """A count llama.cpp reads as a u32 (or an array of them, per layer: the largest); None when
    absent. Raises GGUFError (without the path: facts_of adds it) for anything else: a float (NaN
    or not), a negative or 64-bit number, a string, a bool."""
    value = meta.get(f"{arch}.{key}")
    if value is None or isinstance(value, SkippedArray) and value.item_type in _COUNT_TYPES:
        return None  # a long per-layer array read past: unknown, as if absent
    items = value if isinstance(value, list) else [value]
    if not all(type(v) is int and 0 <= v < 2**32 for v in items):
        raise GGUFError(f"{arch}.{key} is {_shown(value)}, where a count (0 to 2**32 - 1) is expected")
    return max(items, default=None)


# The integer value types (GGUF's u8..i64) a count may come as.
_COUNT_TYPES = frozenset({0, 1, 2, 3, 4, 5, 10, 11})


def _shown(value: object) -> str:
    """A metadata value for a message, cut short: 'nan', "'abc'", '[1, 2, 3, …]'."""
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def kv_bytes_per_token(meta: dict, arch: str) -> int:
    """Per layer, n_head_kv x (key + value head size) at f16, as llama.cpp allocates it (an
    upper bound for sliding-window layers; see backends.llamacpp.kv_token_bytes). Raises
    GGUFError for a count that is none (see _arch_int)."""
    n_layer = _arch_int(meta, arch, "block_count") or 0
    n_head = _arch_int(meta, arch, "attention.head_count") or 1
    n_head_kv = _arch_int(meta, arch, "attention.head_count_kv") or n_head
    head = (_arch_int(meta, arch, "embedding_length") or 0) // max(1, n_head)
    k_len = _arch_int(meta, arch, "attention.key_length") or head
    v_len = _arch_int(meta, arch, "attention.value_length") or head
    return n_layer * n_head_kv * (k_len + v_len) * KV_BYTES


def _quantisation(meta: dict, headers: Sequence[GGUFHeader]) -> str:
    file_type = meta.get("general.file_type")
    if type(file_type) is int and file_type in FILE_TYPES:
        return FILE_TYPES[file_type]
    # Without it: the type most of the matrices' elements have.
    counts: Counter[int] = Counter()
    for h in headers:
        for t in h.tensors:
            if len(t.shape) >= 2:
                counts[t.ggml_type] += t.num_elements
    if not counts:
        return "?"
    ggml_type = counts.most_common(1)[0][0]
    return TENSOR_TYPES.get(ggml_type, f"type {ggml_type}")


def _token_text(tokens: list, meta: dict, key: str) -> str | None:
    token = meta.get(key)
    return tokens[token] if type(token) is int and 0 <= token < len(tokens) else None


def fim_texts(tokens: Sequence[str]) -> dict[str, str]:
    """The FIM tokens' texts by role, as draftwise.fim finds them (prefix, suffix and middle, or
    a middle-less family's prefix and suffix), {} when the vocabulary lacks them."""
    vocabulary = set(tokens)
    found = {role: next((t for t in texts if t in vocabulary), None) for role, texts in FIM_TEXTS.items()}
    found = {role: text for role, text in found.items() if text is not None}
    complete = {"prefix", "suffix", "middle"} <= set(found)
    middleless = found.get("prefix") in MIDDLELESS_PREFIXES and "suffix" in found
    return found if complete or middleless else {}


def facts_of(headers: Sequence[GGUFHeader]) -> ModelFacts:
    """One model's facts from its header (a split model: every part's, the first holding the
    metadata). Raises GGUFError naming the file for a header that is no model llama.cpp loads."""
    first = headers[0]
    try:
        return _facts(headers)
    except GGUFError as exc:
        raise GGUFError(f"{first.path}: cannot be used ({exc})") from None


def _tokens(meta: dict) -> tuple[list[str], bool]:
    """The token list's texts ([] where it was read past), and whether there is one. Raises
    GGUFError for a list of anything but strings."""
    raw = meta.get(TOKENS_KEY)
    if raw is None:
        return [], False
    if isinstance(raw, SkippedArray) and raw.item_type == 8:
        return [], True
    if isinstance(raw, list) and all(isinstance(t, str) for t in raw):
        return raw, True
    raise GGUFError(f"{TOKENS_KEY} is {_shown(raw)}, not a list of strings")


def _facts(headers: Sequence[GGUFHeader]) -> ModelFacts:
    first = headers[0]
    meta = first.metadata
    if not any(h.tensors for h in headers):
        raise GGUFError("a header without tensors: no weights, not a model")
    arch = meta.get("general.architecture", "?")
    arch = arch if isinstance(arch, str) and arch else "?"
    tokens, has_tokens = _tokens(meta)
    vocabulary = set(tokens)
    template = meta.get("tokenizer.chat_template")
    template = template if isinstance(template, str) and template else None
    if template:
        chat = "gguf"
    else:
        family = family_template(arch, vocabulary.__contains__)
        chat = f"{family} (family default)" if family else "none"
    # the template's format, else the family's (its vocabulary's tokens), else plain JSON; none without chat
    tool_format = choose_format(template, vocabulary.__contains__) if chat != "none" else None
    eot = _token_text(tokens, meta, "tokenizer.ggml.eot_token_id") or next(
        (t for t in EOT_TEXTS if t in vocabulary), None
    )
    name = meta.get("general.name")
    size_label = meta.get("general.size_label")
    vocab_size = len(meta[TOKENS_KEY]) if has_tokens else _arch_int(meta, arch, "vocab_size")
    size_bytes = sum(h.file_size for h in headers)
    # NOTE: a layer's K and V projections hold a weight (a bit at least) for each element its
    # cache keeps per token, so a real model's KV cache per token is far below its file's size;
    # a header claiming more (or less than nothing) is capped there (and at 0).
    kv_per_token = min(max(0, kv_bytes_per_token(meta, arch)), size_bytes)
    return ModelFacts(
        gguf_name=name if isinstance(name, str) and name else first.path.name,
        architecture=arch,
        num_params=sum(t.num_elements for h in headers for t in h.tensors),
        size_label=size_label if isinstance(size_label, str) and size_label else None,
        quantisation=_quantisation(meta, headers),
        size_bytes=size_bytes,
        vocab_size=vocab_size,
        context_length=_arch_int(meta, arch, "context_length"),
        chat_template=chat,
        tool_format=tool_format.name if tool_format is not None else None,
        fim=fim_texts(tokens),
        eot=eot or _token_text(tokens, meta, "tokenizer.ggml.eos_token_id"),
        kv_bytes_per_token=kv_per_token,
        vocabulary_id=first.vocabulary_id,
    )


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is none: not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_needed(facts: ModelFacts, n_ctx: int, num_slots: int = 1) -> int:
    """The weights, the KV cache of every slot's window, and a margin for the rest: never
    negative, and the KV cache per token at most the file's size (facts_of's cap, kept here too
    for facts built elsewhere)."""
    kv_per_token = min(max(0, facts.kv_bytes_per_token), max(0, facts.size_bytes))
    return max(0, facts.size_bytes) + kv_per_token * max(0, n_ctx) * max(1, num_slots) + OVERHEAD_BYTES


def format_gib(n: int) -> str:
    """Bytes as GiB for a message, grouped: 1_117_320_768 -> '1.0 GiB'; 2**50 -> '1,048,576.0 GiB'."""
    return f"{n / 2**30:,.1f} GiB"


def check_memory(path: Path, facts: ModelFacts, n_ctx: int, num_slots: int = 1, available: int | None = None) -> None:
    """Raises ModelError naming the file when the model would not fit in the memory left.

    NOTE: MemAvailable counts the page cache as free, and a model file already read sits there,
    so a model loaded a second time is not counted twice."""
    available = available_memory() if available is None else available
    if available is None:
        return
    needed = memory_needed(facts, n_ctx, num_slots)
    if needed > available:
        kv = needed - facts.size_bytes - OVERHEAD_BYTES
        raise ModelError(
            f"{path}: needs about {format_gib(needed)} ({format_gib(facts.size_bytes)} of weights, "
            f"{format_gib(kv)} of KV cache at n_ctx {n_ctx}) but only {format_gib(available)} of memory "
            "is available; close other programs, use a smaller --n-ctx or a smaller model"
        )
