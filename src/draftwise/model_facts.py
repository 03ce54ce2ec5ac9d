"""What a GGUF model is, from its header alone: family, parameters, quantisation, vocabulary,
context, chat template, tool-call format, FIM tokens, and the memory it needs to run.

`facts_of(headers)` reads one model (a split model's parts together); `check_memory` refuses a
model that would not fit in the memory left before llama.cpp maps it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from draftwise.backends.chat_templates import family_template
from draftwise.errors import ModelError
from draftwise.fim import FIM_TEXTS, MIDDLELESS_PREFIXES
from draftwise.gguf_header import FILE_TYPES, TENSOR_TYPES, GGUFHeader, SkippedArray
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
    kv_bytes_per_token: int  # the KV cache per position at f16

    def as_json(self) -> dict:
        return asdict(self)


def _arch_int(meta: dict, arch: str, key: str) -> int | None:
    value = meta.get(f"{arch}.{key}")
    if isinstance(value, list):  # per layer (some models vary heads by layer): the largest
        value = max(value, default=None)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def kv_bytes_per_token(meta: dict, arch: str) -> int:
    """Per layer, n_head_kv x (key + value head size) at f16, as llama.cpp allocates it (an
    upper bound for sliding-window layers; see backends.llamacpp.kv_token_bytes)."""
    n_layer = _arch_int(meta, arch, "block_count") or 0
    n_head = _arch_int(meta, arch, "attention.head_count") or 1
    n_head_kv = _arch_int(meta, arch, "attention.head_count_kv") or n_head
    head = (_arch_int(meta, arch, "embedding_length") or 0) // max(1, n_head)
    k_len = _arch_int(meta, arch, "attention.key_length") or head
    v_len = _arch_int(meta, arch, "attention.value_length") or head
    return n_layer * n_head_kv * (k_len + v_len) * KV_BYTES


def _quantisation(meta: dict, headers: Sequence[GGUFHeader]) -> str:
    file_type = meta.get("general.file_type")
    if isinstance(file_type, int) and file_type in FILE_TYPES:
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
    return tokens[token] if isinstance(token, int) and 0 <= token < len(tokens) else None


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
    metadata)."""
    first = headers[0]
    meta = first.metadata
    arch = str(meta.get("general.architecture", "?"))
    raw_tokens = meta.get("tokenizer.ggml.tokens")
    tokens = raw_tokens if isinstance(raw_tokens, list) else []  # [] where read without them
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
    read = isinstance(raw_tokens, (list, SkippedArray))
    vocab_size = len(raw_tokens) if read else _arch_int(meta, arch, "vocab_size")
    return ModelFacts(
        gguf_name=str(name) if name else first.path.name,
        architecture=arch,
        num_params=sum(t.num_elements for h in headers for t in h.tensors),
        size_label=str(meta["general.size_label"]) if meta.get("general.size_label") else None,
        quantisation=_quantisation(meta, headers),
        size_bytes=sum(h.file_size for h in headers),
        vocab_size=vocab_size,
        context_length=_arch_int(meta, arch, "context_length"),
        chat_template=chat,
        tool_format=tool_format.name if tool_format is not None else None,
        fim=fim_texts(tokens),
        eot=eot or _token_text(tokens, meta, "tokenizer.ggml.eos_token_id"),
        kv_bytes_per_token=kv_bytes_per_token(meta, arch),
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
    """The weights, the KV cache of every slot's window, and a margin for the rest."""
    return facts.size_bytes + facts.kv_bytes_per_token * n_ctx * max(1, num_slots) + OVERHEAD_BYTES


def check_memory(path: Path, facts: ModelFacts, n_ctx: int, num_slots: int = 1, available: int | None = None) -> None:
    """Raises ModelError naming the file when the model would not fit in the memory left.

    NOTE: MemAvailable counts the page cache as free, and a model file already read sits there,
    so a model loaded a second time is not counted twice."""
    available = available_memory() if available is None else available
    if available is None:
        return
    needed = memory_needed(facts, n_ctx, num_slots)
    if needed > available:
        gib = 2**30
        kv = facts.kv_bytes_per_token * n_ctx * max(1, num_slots)
        raise ModelError(
            f"{path}: needs about {needed / gib:.1f} GiB ({facts.size_bytes / gib:.1f} GiB of weights, "
            f"{kv / gib:.1f} GiB of KV cache at n_ctx {n_ctx}) but only {available / gib:.1f} GiB of memory "
            "is available; close other programs, use a smaller --n-ctx or a smaller model"
        )
