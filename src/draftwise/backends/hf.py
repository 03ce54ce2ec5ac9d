"""PyTorch/transformers backend: a model directory, or a GGUF file dequantised by transformers.

One sequence per backend in a transformers DynamicCache. `extend` runs one forward
over the new tokens and returns logits for all of them; `truncate` crops the cache.
torch and transformers are imported lazily: they are the optional `hf` extra.

Loaded with slots, the backend holds one cache per sequence over the one model, and
`extend_batch` runs several sequences in one padded forward: each sequence's past is
left-padded to the longest, its new tokens right-padded to the most, with an attention
mask over both pads and explicit positions; afterwards each sequence's new keys and
values are appended to its own cache. An item far longer than the others (a prompt
chunk beside one-row decoding steps) runs in a forward of its own instead of padding
them all to its length. The caches stay per request (a truncate touches
one sequence only); the padded copy exists for the forward alone.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np

from draftwise.backends.base import BackendError, Capabilities, ContextOverflowError
from draftwise.backends.hf_tokenizers import load_tokenizer, wrap_tokenizer
from draftwise.types import ConfigError

DTYPES = ("float32", "bfloat16", "float16", "float64")
DEVICES = ("cpu", "cuda", "auto")
MAX_BATCH = 512  # tokens per forward when prefilling long prompts (bounds activation memory)
# Padding rows past which a batch's longest item runs in a forward of its own. Measured on the
# 0.5B in bf16 on this CPU (4 sequences, one with r rows, three with 1): r = 128 padded 515 ms,
# split 260 ms; r = 32 (93 padding rows) 208 ms vs 185 ms; 4 x 5 rows padded 107 ms vs 4 x 1 95 ms.
SPLIT_PADDING = 64


def _torch():
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        raise BackendError("the hf backend needs torch and transformers: pip install 'draftwise[hf]'") from exc
    return torch


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when available, else 'cpu'; 'cuda' without CUDA is an error."""
    torch = _torch()
    if device not in DEVICES and not device.startswith("cuda:"):
        raise ConfigError(f"device must be one of {', '.join(DEVICES)} (or cuda:N), got {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendError(f"device {device!r} asked for, but this torch build sees no CUDA device")
    return device


def resolve_dtype(dtype: str):
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    torch = _torch()
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}[
        dtype
    ]


def _check_window(config, n_ctx: int, name: str) -> None:
    """Refuse an n_ctx beyond the model's trained window (max_position_embeddings), as llama.cpp's backend does:
    beyond it the model's positions are ones it never saw."""
    # NOTE: not every family's config has a position limit (or names it so): no check then.
    trained = getattr(config, "max_position_embeddings", None)
    if isinstance(trained, int) and 0 < trained < n_ctx:
        raise ConfigError(
            f"n_ctx {n_ctx} is beyond {name}'s trained context window of {trained} tokens; "
            f"use --n-ctx {trained} or less"
        )


class HFBackend:
    """A Backend over a transformers causal LM.

    `HFBackend(path, dtype=..., device=...)` loads a model directory or a GGUF file;
    `HFBackend.from_model(model, tokenizer)` wraps a model already in memory (tests).
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        n_ctx: int = 4096,
        n_threads: int | None = None,
        name: str | None = None,
        slots: int = 1,
    ) -> None:
        torch = _torch()
        from transformers import AutoConfig, AutoModelForCausalLM

        path = Path(model_path)
        if path.is_dir():
            directory, gguf_file = path, None
        elif path.is_file() and path.suffix == ".gguf":
            directory, gguf_file = path.parent, path.name  # transformers dequantises every tensor
        elif path.is_file():
            raise ConfigError(f"{path} is neither a model directory nor a .gguf file")
        else:
            raise FileNotFoundError(f"model not found: {path}")
        torch_dtype, torch_device = resolve_dtype(dtype), resolve_device(device)
        if n_threads:
            torch.set_num_threads(n_threads)  # NOTE: process-wide in torch, not per model
        try:
            # NOTE: the config first: a context the model cannot hold is refused before its weights load.
            config = AutoConfig.from_pretrained(directory, gguf_file=gguf_file)
        except Exception as exc:  # OSError, ValueError, ImportError (gguf), ...
            raise BackendError(f"transformers could not load {path}: {exc}") from exc
        _check_window(config, n_ctx, name or path.name)
        try:
            model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf_file, dtype=torch_dtype)
        except Exception as exc:  # OSError, ValueError, ImportError (accelerate, gguf), ...
            raise BackendError(f"transformers could not load {path}: {exc}") from exc
        model = model.to(torch_device).eval()
        tokenizer = load_tokenizer(directory, gguf_file, model)
        stat = path.stat() if gguf_file else _dir_stat(path)
        identity = f"hf:{path.resolve()}:{stat[0]}:{stat[1]}:{dtype}:{torch_device}"
        self._setup(model, tokenizer, n_ctx=n_ctx, name=name or path.name, identity=identity, slots=slots)

    @classmethod
    def from_model(cls, model, tokenizer=None, *, name: str = "model", n_ctx: int = 4096, slots: int = 1) -> HFBackend:
        """Wrap a loaded model; tokenizer: a transformers tokenizer, a Tokenizer, or None (bytes)."""
        _torch()
        _check_window(model.config, n_ctx, name)
        self = cls.__new__(cls)
        digest = hashlib.sha256(model.config.to_json_string().encode()).hexdigest()[:16]
        dtype = str(model.dtype).removeprefix("torch.")
        identity = f"hf:{name}:{digest}:{dtype}:{model.device}"
        self._setup(
            model.eval(), wrap_tokenizer(tokenizer, model), n_ctx=n_ctx, name=name, identity=identity, slots=slots
        )
        return self

    def _setup(self, model, tokenizer, *, n_ctx: int, name: str, identity: str, slots: int = 1) -> None:
        if slots < 1:
            raise ConfigError(f"slots must be >= 1, got {slots}")
        torch = _torch()
        self._torch = torch
        self._model = model
        self._device = model.device
        self._vocab_size = int(model.config.vocab_size)  # logits width; may exceed the tokenizer
        self._n_ctx = n_ctx  # within the model's window: checked before loading (or in from_model)
        # transformers 5.x renamed past_key_values= to cache=; older 5.x releases only know the former.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._ids: list[int] = []
        self._cache = self._new_cache()
        self._kv_layers = kv_layers(model.config, model.dtype.itemsize)
        self.name = name
        self.identity = identity
        self.tokenizer = tokenizer
        dtype = str(model.dtype).removeprefix("torch.")
        # Measured: on CPU, float32/float64 batched logits equal one-at-a-time ones; bf16 drifts.
        exact = self._device.type == "cpu" and dtype in ("float32", "float64")
        self.capabilities = Capabilities(
            exact=exact, device=str(self._device), dtype=dtype, max_branches=1, num_slots=slots, batching=True
        )
        self.n_threads = torch.get_num_threads() if self._device.type == "cpu" else 0
        self.num_forwards = 0
        self.num_batches = 0  # extend_batch forwards over several sequences
        self._owner = self
        self._slots: list[HFBackend] = [self]
        if slots > 1:
            kinds = {type(layer).__name__ for layer in self._cache.layers}
            if kinds != {"DynamicLayer"}:
                raise ConfigError(
                    f"parallel slots need a plain KV cache; {name} has {', '.join(sorted(kinds))} layers "
                    "(use --parallel 1)"
                )
            self._slots += [self._sequence_of_mine(i) for i in range(1, slots)]

    def _sequence_of_mine(self, index: int) -> HFBackend:
        """Another sequence over this model: a Backend with its own ids and cache."""
        seq = HFBackend.__new__(HFBackend)
        seq.__dict__.update(self.__dict__)
        seq._ids, seq._cache = [], self._new_cache()
        seq.name, seq._slots, seq._owner = f"{self.name}#{index}", [seq], self
        seq.capabilities = replace(self.capabilities, num_slots=1, batching=False)  # its owner batches it
        return seq

    def _new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self._model.config)

    # ---------------------------------------------------------------- sequences
    @property
    def num_slots(self) -> int:
        return self.capabilities.num_slots

    def sequence(self, slot: int) -> HFBackend:
        return self._slots[slot]

    def extend_batch(self, items: Sequence[tuple[HFBackend, Sequence[int], int]]) -> list[np.ndarray]:
        """Several sequences in one padded forward; an item far longer than the rest, or over
        MAX_BATCH, runs in a forward of its own (see the module docstring)."""
        for seq, _, _ in items:
            if not isinstance(seq, HFBackend) or seq._owner is not self:
                raise BackendError(f"{seq!r} is not a sequence of {self.name}")
        if len({id(seq) for seq, _, _ in items}) < len(items):
            raise BackendError("a sequence appears twice in one batch")
        live = [(i, seq, [int(t) for t in ids], n) for i, (seq, ids, n) in enumerate(items) if len(ids)]
        for _, seq, ids, n in live:
            seq._check(ids)
            if not 0 <= n <= len(ids):
                raise BackendError(f"num_logits {n} outside 0..{len(ids)}")
        out = [np.zeros((0, self._vocab_size), dtype=np.float32) for _ in items]
        # The longest items go alone while each would pad the rest by SPLIT_PADDING rows or more
        # (a prompt chunk beside one-row decoding steps), and so does a chunk over MAX_BATCH.
        group = sorted(live, key=lambda item: -len(item[2]))
        alone = []
        while len(group) > 1 and (
            len(group[0][2]) > MAX_BATCH or (len(group) - 1) * (len(group[0][2]) - len(group[1][2])) >= SPLIT_PADDING
        ):
            alone.append(group.pop(0))
        if len(group) < 2:
            alone, group = alone + group, []
        for i, seq, ids, n in alone:
            if n:
                out[i] = seq.extend(ids, n)
            else:
                seq.prefill(ids)
        if group:
            for (i, _, _, n), rows in zip(group, self._forward_batch([(seq, ids, n) for _, seq, ids, n in group])):
                if n:
                    out[i] = self._to_numpy(rows)
        return out

    def _forward_batch(self, items: list[tuple[HFBackend, list[int], int]]) -> list:
        torch = self._torch
        past = [seq.num_cached for seq, _, _ in items]
        new = [len(ids) for _, ids, _ in items]
        P, N, B = max(past), max(new), len(items)
        input_ids = torch.zeros((B, N), dtype=torch.long)
        positions = torch.zeros((B, N), dtype=torch.long)
        mask = torch.zeros((B, P + N), dtype=torch.long)
        for b, (_, ids, _) in enumerate(items):
            input_ids[b, : new[b]] = torch.tensor(ids)
            positions[b] = torch.arange(past[b], past[b] + N)  # pads continue the count; they are masked
            mask[b, P - past[b] : P + new[b]] = 1
        cache = self._new_cache()
        if P:
            for layer in range(len(cache.layers)):
                like = next(seq._cache.layers[layer].keys for seq, _, _ in items if seq.num_cached)
                shape = (B, like.shape[1], P, like.shape[3])
                k, v = like.new_zeros(shape), like.new_zeros(shape)
                for b, (seq, _, _) in enumerate(items):
                    if past[b]:
                        k[b, :, P - past[b] :] = seq._cache.layers[layer].keys[0]
                        v[b, :, P - past[b] :] = seq._cache.layers[layer].values[0]
                cache.update(k, v, layer)
        first = min((n_b - n for n_b, (_, _, n) in zip(new, items) if n), default=N - 1)
        with torch.inference_mode():
            result = self._model(
                input_ids=input_ids.to(self._device),
                attention_mask=mask.to(self._device),
                position_ids=positions.to(self._device),
                use_cache=True,
                logits_to_keep=N - first,
                **{self._cache_kw: cache},
            )
        self.num_forwards += 1
        self.num_batches += 1
        try:
            for b, (seq, ids, _) in enumerate(items):
                for layer, batched in enumerate(cache.layers):
                    seq._cache.update(
                        batched.keys[b : b + 1, :, P : P + new[b]].clone(),
                        batched.values[b : b + 1, :, P : P + new[b]].clone(),
                        layer,
                    )
                seq._ids.extend(ids)
        except BaseException:
            for (seq, _, _), start in zip(items, past):
                seq._restore(start)
            raise
        return [result.logits[b, new[b] - n - first : new[b] - first] for b, (_, _, n) in enumerate(items)]

    # ---------------------------------------------------------------- properties
    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def num_cached(self) -> int:
        return len(self._ids)

    @property
    def cached_ids(self) -> list[int]:
        return list(self._ids)

    def kv_bytes(self) -> dict[str, int]:
        """From the config (kv_layers): a DynamicCache reserves nothing ahead, so allocated is
        used; the backend itself counts every sequence's cache, a sequence its own."""
        per_token = sum(size for size, _ in self._kv_layers)
        used = sum(
            size * (min(len(seq._ids), window) if window else len(seq._ids))
            for seq in self._slots
            for size, window in self._kv_layers
        )
        return {"per_token": per_token, "allocated": used, "used": used}

    def weight_bytes(self) -> int:
        if self._model is None:
            return 0
        tensors = {id(t): t for t in (*self._model.parameters(), *self._model.buffers())}  # tied weights once
        return sum(t.numel() * t.element_size() for t in tensors.values())

    # ---------------------------------------------------------------- decoding
    def _forward(self, ids: Sequence[int], num_logits: int):
        """Append ids to the cache; logits [num_logits, V] for the last num_logits positions."""
        torch = self._torch
        self._check(ids)
        start = len(self._ids)
        first_read = len(ids) - num_logits  # rows before it skip the vocabulary projection
        rows = []
        try:
            with torch.inference_mode():
                for offset in range(0, len(ids), MAX_BATCH):
                    chunk = [int(t) for t in ids[offset : offset + MAX_BATCH]]
                    input_ids = torch.tensor([chunk], dtype=torch.long, device=self._device)  # [1, n]
                    read = min(len(chunk), offset + len(chunk) - first_read)
                    # logits_to_keep=n computes the last n rows only (0 would mean all of them).
                    out = self._model(
                        input_ids=input_ids,
                        use_cache=True,
                        logits_to_keep=max(read, 1),
                        **{self._cache_kw: self._cache},
                    )
                    self.num_forwards += 1
                    self._ids.extend(chunk)
                    if read > 0:
                        rows.append(out.logits[0, -read:])  # [read, V]
        except BaseException:
            self._restore(start)  # a failed forward may have grown some layers: undo it
            raise
        if not rows:
            return None
        return rows[0] if len(rows) == 1 else torch.cat(rows)

    def _check(self, ids: Sequence[int]) -> None:
        if len(self._ids) + len(ids) > self._n_ctx:
            raise ContextOverflowError(f"{len(self._ids) + len(ids)} tokens exceed the context of {self._n_ctx}")
        if min(ids) < 0 or max(ids) >= self._vocab_size:
            raise BackendError(f"token id outside the vocabulary of {self._vocab_size}")

    def _to_numpy(self, logits) -> np.ndarray:
        # One device -> host copy per call: verification needs every row on the host.
        if logits.dtype not in (self._torch.float32, self._torch.float64):
            logits = logits.float()
        return logits.cpu().numpy()

    def extend(self, ids: Sequence[int], num_logits: int | None = None) -> np.ndarray:
        if not len(ids):
            return np.zeros((0, self._vocab_size), dtype=np.float32)
        return self._to_numpy(self._forward(ids, len(ids) if num_logits is None else num_logits))

    def prefill(self, ids: Sequence[int]) -> None:
        if len(ids):
            self._forward(ids, 0)

    def _crop(self, n_keep: int) -> None:
        """Crop every layer to n_keep positions (layers can differ after a failed forward)."""
        for layer in self._cache.layers:
            n_layer = layer.get_seq_length()
            if n_layer > n_keep:
                layer.crop(n_keep - n_layer)  # negative: drop that many trailing positions
        lengths = {layer.get_seq_length() for layer in self._cache.layers}
        if lengths - {n_keep}:
            raise BackendError(f"the KV cache could not be cropped to {n_keep} positions (layers hold {lengths})")

    def _restore(self, n_keep: int) -> None:
        try:
            self._crop(n_keep)
            del self._ids[n_keep:]
        except Exception:
            self.reset()  # last resort: an empty cache is always consistent

    def truncate(self, n_keep: int) -> None:
        if not 0 <= n_keep <= len(self._ids):
            raise BackendError(f"cannot truncate {len(self._ids)} cached positions to {n_keep}")
        if n_keep == len(self._ids):
            return
        if n_keep == 0:
            self.reset()
            return
        self._crop(n_keep)
        del self._ids[n_keep:]

    def reset(self) -> None:
        self._cache = self._new_cache()
        self._ids.clear()

    def interruptible(self, check: Callable[[], bool]) -> AbstractContextManager[None]:
        return nullcontext()  # a transformers forward runs to its end

    def close(self) -> None:
        for seq in self._slots[1:]:
            seq._ids.clear()
            seq._cache = seq._model = None
        self._ids.clear()
        self._cache = None
        if self._model is not None:
            on_cuda = self._device.type == "cuda"
            self._model = None
            if on_cuda:
                self._torch.cuda.empty_cache()


def kv_layers(config, element_size: int) -> list[tuple[int, int | None]]:
    """Per decoder layer: (bytes one cached position takes, keys and values; its sliding window or
    None), from the config: num_key_value_heads (else num_attention_heads) x head_dim (else
    hidden_size / num_attention_heads) x 2 x the dtype's element size.
    Example: Qwen2.5-Coder 1.5B (28 layers, 2 KV heads of 128) in bfloat16 -> 28 x (1024, None)."""
    text = config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    size = 2 * kv_heads * head_dim * element_size
    n = text.num_hidden_layers
    types = getattr(text, "layer_types", None) or ["full_attention"] * n
    window = getattr(text, "sliding_window", None)
    return [(size, window if kind == "sliding_attention" and window else None) for kind in types[:n]]


def _dir_stat(path: Path) -> tuple[int, int]:
    """(total bytes, newest mtime) of a model directory's files: changes when weights do."""
    files = [f.stat() for f in path.iterdir() if f.is_file()]
    return sum(s.st_size for s in files), max((s.st_mtime_ns for s in files), default=0)
