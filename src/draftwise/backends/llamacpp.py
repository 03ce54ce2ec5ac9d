"""llama.cpp backend (GGUF, quantised, CPU) through llama-cpp-python's low-level API.

One sequence (seq_id 0) per context, or with slots one sequence per slot over one
unified KV cache (continuous batching: `extend_batch` decodes several in one forward).
`extend` decodes a batch with logits requested where they are read and returns them as
one [n, V] array; `truncate` removes KV entries with llama_memory_seq_rm and raises when
the removal is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np

from draftwise.backends.base import (
    BackendError,
    Capabilities,
    ContextOverflowError,
    ForwardInterrupted,
    kv_figures,
    utf8,
)
from draftwise.backends.chat_templates import ChatTemplate, choose_template, named_template, render_builtin
from draftwise.backends.llamacpp_load import LlamaModelContext, init_context, release_memory
from draftwise.types import ConfigError

# ggml cache types -> (bytes, elements) of one block; f16 (1) is llama.cpp's default cache type.
GGML_BLOCKS = {
    0: (4, 1),  # f32
    1: (2, 1),  # f16
    30: (2, 1),  # bf16
    2: (18, 32),  # q4_0
    3: (20, 32),  # q4_1
    6: (22, 32),  # q5_0
    7: (24, 32),  # q5_1
    8: (34, 32),  # q8_0
    20: (18, 32),  # iq4_nl
}


def kv_token_bytes(C, model, metadata: dict, type_k: int = 1, type_v: int = 1) -> int:
    """Bytes one cached position takes in llama.cpp's KV cache: per layer, n_head_kv x head size
    elements of keys and of values at the cache's types (ggml types, f16 = 1 by default). The
    head size is the GGUF's `ARCH.attention.key_length` / `value_length`, else n_embd / n_head.

    Checked by hand against llama.cpp 0.3.36 on the default pair, loaded with n_ctx 512: its log
    prints "KV buffer size = 14.00 MiB (512 cells, 28 layers)" for the 1.5B (28 x (256 + 256) x 2
    = 28672 bytes a cell) and 6.00 MiB for the 0.5B (24 x (128 + 128) x 2 = 12288), and
    llama_state_get_size grows by exactly that plus 12 bytes of cell metadata per token decoded
    (tests/integration/test_llamacpp_tiny.py checks the same on a tiny model).
    NOTE: for a sliding-window model (llama_model_n_swa > 0) llama.cpp may keep fewer cells in
    those layers; this counts every layer whole (an upper bound)."""
    arch = metadata.get("general.architecture", "")
    n_head = max(1, C.llama_model_n_head(model))
    head = C.llama_model_n_embd(model) // n_head
    k_len = int(metadata.get(f"{arch}.attention.key_length", head))
    v_len = int(metadata.get(f"{arch}.attention.value_length", head))
    n_head_kv = C.llama_model_n_head_kv(model)

    def row(ggml_type: int, elements: int) -> int:
        size, block = GGML_BLOCKS.get(int(ggml_type), (2, 1))
        return elements * size // block

    return C.llama_model_n_layer(model) * (row(type_k, n_head_kv * k_len) + row(type_v, n_head_kv * v_len))


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class LlamaCppTokenizer:
    def __init__(self, llm, llama_cpp, chat_template: ChatTemplate | None = None, model_name: str = "") -> None:
        self._llm = llm
        self._vocab = llama_cpp.llama_model_get_vocab(llm.model)
        self._c = llama_cpp
        n = llm.n_vocab()
        self._n_vocab = n
        n_tokens = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.eos_token_ids = frozenset(t for t in range(n_tokens) if llama_cpp.llama_vocab_is_eog(self._vocab, t))
        self._model_name = model_name
        self._chat = choose_template(
            chat_template,
            llm.metadata.get("tokenizer.chat_template"),
            llm.metadata.get("general.architecture", ""),
            self._is_token,
        )
        self._formatters: dict[bool, object] = {}  # by add_generation_prompt
        self._control_texts: frozenset[str] | None = None

    @property
    def vocab_size(self) -> int:
        return self._n_vocab

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        # NOTE: with parse_special off llama.cpp still reads user-defined tokens (Qwen's
        # "<tool_call>") as one token each, as transformers does; control tokens become text.
        return self._llm.tokenize(utf8(text), add_bos=add_special, special=parse_special)

    @property
    def control_texts(self) -> frozenset[str]:
        """Texts of the control (and unknown-type) tokens: what parse_special turns on."""
        if self._control_texts is None:
            c = self._c
            parsed = c.LLAMA_TOKEN_ATTR_CONTROL | c.LLAMA_TOKEN_ATTR_UNKNOWN
            n_tokens = c.llama_vocab_n_tokens(self._vocab)
            self._control_texts = frozenset(
                self.token_text(t) for t in range(n_tokens) if c.llama_vocab_get_attr(self._vocab, t) & parsed
            )
        return self._control_texts

    def fim_token_ids(self) -> dict[str, int]:
        """The vocabulary's fill-in-the-middle tokens by role (draftwise.fim): llama.cpp reads them
        from `tokenizer.ggml.fim_*` metadata or, without it, finds them by their texts."""
        c, vocab = self._c, self._vocab
        found = {
            "prefix": c.llama_vocab_fim_pre(vocab),
            "suffix": c.llama_vocab_fim_suf(vocab),
            "middle": c.llama_vocab_fim_mid(vocab),
            "pad": c.llama_vocab_fim_pad(vocab),
            "repo": c.llama_vocab_fim_rep(vocab),
            "file_sep": c.llama_vocab_fim_sep(vocab),
        }
        return {role: token for role, token in found.items() if token >= 0}

    def decode(self, ids: Sequence[int]) -> str:
        return self._llm.detokenize(list(ids)).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        raw = self._c.llama_vocab_get_text(self._vocab, token_id)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def llguidance_tokenizer(self, n_vocab: int):
        """llguidance's adapter over this vocabulary (it tokenises with llama.cpp itself)."""
        import warnings

        from llguidance.llamacpp import lltokenizer_from_vocab

        with warnings.catch_warnings():  # it calls a deprecated per-token getter 150k times
            warnings.simplefilter("ignore", DeprecationWarning)
            return lltokenizer_from_vocab(self._vocab, n_vocab=n_vocab, eos_token=self._grammar_eos())

    def _grammar_eos(self) -> int:
        """The end-of-generation token a grammar allows when the answer is complete: the
        vocabulary's EOS, or for chat models whose EOS is not an end of turn, the first EOG."""
        eos = self._c.llama_vocab_eos(self._vocab)
        return eos if eos in self.eos_token_ids or not self.eos_token_ids else min(self.eos_token_ids)

    def _is_token(self, text: str) -> bool:
        ids = self.encode(text, add_special=False, parse_special=True)
        return len(ids) == 1 and self.token_text(ids[0]) == text

    @property
    def chat_template(self) -> str | None:
        """The Jinja source (None for a built-in template, which knows no tools, or none)."""
        return self._chat.jinja if self._chat is not None else None

    def apply_chat_template(
        self, messages: Sequence[dict], *, add_generation_prompt: bool = True, tools: Sequence[dict] | None = None
    ) -> str:
        if self._chat is None:
            raise BackendError(
                f"{self._model_name or 'this model'} has no chat template in its GGUF metadata and its family has "
                "no known default; name one with --chat-template (a llama.cpp built-in such as chatml, llama3, "
                "gemma, mistral-v7, phi3, or a Jinja file), or use a plain prompt"
            )
        if self._chat.builtin is not None:
            return render_builtin(self._chat.builtin, messages, add_generation_prompt=add_generation_prompt)
        formatter = self._formatters.get(add_generation_prompt)
        if formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            def text_of(token: int) -> str:
                return self.token_text(token) if token >= 0 else ""

            formatter = self._formatters[add_generation_prompt] = Jinja2ChatFormatter(
                template=self._chat.jinja,
                eos_token=text_of(self._llm.token_eos()),
                bos_token=text_of(self._llm.token_bos()),
                add_generation_prompt=add_generation_prompt,
            )
        return formatter(messages=list(messages), tools=list(tools) if tools else None).prompt


class _SequenceOps:
    """Cache operations on one llama.cpp sequence (seq_id) of a backend's context."""

    _owner: LlamaCppBackend
    _seq_id: int
    _ids: list[int]
    _n_ctx: int

    @property
    def vocab_size(self) -> int:
        return self._owner._n_vocab

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def num_cached(self) -> int:
        return len(self._ids)

    @property
    def cached_ids(self) -> list[int]:
        return list(self._ids)

    def extend(self, ids: Sequence[int], num_logits: int | None = None) -> np.ndarray:
        if not len(ids):
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        return self._owner._decode_items([(self, ids, len(ids) if num_logits is None else num_logits)])[0]

    def prefill(self, ids: Sequence[int]) -> None:
        if len(ids):
            self._owner._decode_items([(self, ids, 0)])

    def share_prefix(self, source: object, n: int) -> bool:
        """Make this sequence's cache the first n cached positions of `source`, another sequence of
        the same context (the KV cells are shared, not copied: the context's cache is unified).
        False, changing nothing, when source is not such a sequence or holds fewer positions."""
        if not isinstance(source, _SequenceOps) or source._owner is not self._owner or source is self:
            return False
        if not 0 < n <= len(source._ids):
            return False
        c, mem = self._owner._c, self._owner._mem
        c.llama_memory_seq_rm(mem, self._seq_id, -1, -1)
        c.llama_memory_seq_cp(mem, source._seq_id, self._seq_id, 0, n)
        self._ids[:] = source._ids[:n]
        return True

    def kv_bytes(self) -> dict[str, int]:
        """This sequence's window of the shared cache (n_ctx cells) and the positions it holds."""
        return kv_figures(self._owner._kv_token_bytes, self._n_ctx, len(self._ids))

    def weight_bytes(self) -> int:
        return self._owner._weight_bytes

    def truncate(self, n_keep: int) -> None:
        if not 0 <= n_keep <= len(self._ids):
            raise BackendError(f"cannot truncate {len(self._ids)} cached positions to {n_keep}")
        if n_keep == len(self._ids):
            return
        if not self._owner._c.llama_memory_seq_rm(self._owner._mem, self._seq_id, n_keep, -1):
            raise BackendError(f"llama.cpp refused to remove cached positions >= {n_keep}")
        del self._ids[n_keep:]


class LlamaCppSequence(_SequenceOps):
    """Sequence `seq_id` of a LlamaCppBackend loaded with slots: a Backend of its own."""

    def __init__(self, owner: LlamaCppBackend, seq_id: int) -> None:
        self._owner, self._seq_id, self._ids, self._n_ctx = owner, seq_id, [], owner._n_ctx
        self.name = f"{owner.name}#{seq_id}"
        self.identity, self.tokenizer, self.n_threads = owner.identity, owner.tokenizer, owner.n_threads
        # Decoded through the owner's context: its forwards batch there, and stop with it.
        self.capabilities = replace(owner.capabilities, max_branches=1, num_slots=1, batching=False)

    def interruptible(self, check: Callable[[], bool]) -> AbstractContextManager[None]:
        """The owner's interruptible context: it stops every forward of the shared context."""
        return self._owner.interruptible(check)

    def reset(self) -> None:
        self._owner._c.llama_memory_seq_rm(self._owner._mem, self._seq_id, -1, -1)
        self._ids.clear()

    def close(self) -> None:
        """The owner frees the context; a sequence only forgets its cache."""
        if self._owner._llm is not None:
            self.reset()


class LlamaCppBackend(_SequenceOps):
    # What close() frees; None until __init__ makes it (a failed load closes what it made).
    _llm = _own_ctx = _batch = _tree_batch = None

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_batch: int = 512,
        name: str | None = None,
        n_seq_max: int = 1,
        slots: int = 1,
        chat_template: str | None = None,
    ) -> None:
        """chat_template: a llama.cpp built-in template's name or a Jinja file, used instead of
        the GGUF's own (draftwise.backends.chat_templates)."""
        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"model file not found: {path}")
        template = named_template(chat_template) if chat_template else None  # refused before the load
        if slots < 1:
            raise ConfigError(f"slots must be >= 1, got {slots}")
        if slots > 1 and n_seq_max > 1:
            raise ConfigError("token trees (several branches) and parallel slots cannot be combined")
        from llama_cpp import llama_cpp as C

        self._c = C
        self.n_threads = n_threads or default_threads()
        # NOTE: with token trees (n_seq_max > 1) or slots we create our own context with several
        # sequences over one unified KV cache; the model then keeps a minimal context of its own.
        # Unified, because a split cache makes llama.cpp cut a batch into ubatches of equal rows
        # per sequence (split_equal): a step of one 17-row and three 1-row sequences would take
        # several forwards.
        own_ctx = n_seq_max > 1 or slots > 1
        try:
            self._llm = LlamaModelContext(
                str(path), n_ctx=256 if own_ctx else n_ctx, n_batch=n_batch, n_threads=self.n_threads
            )
        except ValueError as exc:  # llama-cpp-python reports load failures as ValueError
            raise BackendError(f"llama.cpp could not load {path}: {exc}") from exc
        self._own_ctx = None
        trained = C.llama_model_n_ctx_train(self._llm.model)
        if 0 < trained < n_ctx:  # beyond it the model's positions are ones it never saw
            self.close()
            raise ConfigError(
                f"n_ctx {n_ctx} is beyond {path.name}'s trained context window of {trained} tokens; "
                f"use --n-ctx {trained} or less"
            )
        if own_ctx:
            params = C.llama_context_default_params()
            # Every slot may fill a whole window of n_ctx: the shared cache holds them all.
            params.n_ctx, params.n_batch, params.n_ubatch = n_ctx * slots, n_batch, n_batch
            params.n_seq_max, params.kv_unified, params.no_perf = max(n_seq_max, slots), True, True
            params.n_threads = params.n_threads_batch = self.n_threads
            try:
                self._own_ctx = init_context(
                    C, self._llm.model, params, f"a context with {max(n_seq_max, slots)} sequences"
                )
            except ValueError as exc:
                self.close()
                raise BackendError(str(exc)) from exc
        self.n_seq_max = n_seq_max
        model = self._llm.model
        self._weight_bytes = int(C.llama_model_size(model))
        cache = params if own_ctx else self._llm.context_params  # the cache types: f16 unless set
        self._kv_token_bytes = kv_token_bytes(C, model, self._llm.metadata, cache.type_k, cache.type_v)
        # Cells reserved: this context's, and with a context of our own the Llama's minimal one too.
        self._tree_batch = None
        self._pending_tree = None
        self._ctx = self._own_ctx or self._llm.ctx
        self._mem = C.llama_get_memory(self._ctx)
        self._n_ctx = C.llama_n_ctx(self._ctx) // slots
        # Cells the cache reserves: the context's, and with a context of our own the Llama's minimal one's.
        self._kv_cells = C.llama_n_ctx(self._ctx) + (C.llama_n_ctx(self._llm.ctx) if own_ctx else 0)
        # NOTE: llama.cpp clamps n_batch to n_ctx; a larger decode aborts the process.
        n_batch = self._n_batch = min(n_batch, C.llama_n_batch(self._ctx), C.llama_n_ubatch(self._ctx))
        self._n_vocab = self._llm.n_vocab()
        self._batch = C.llama_batch_init(n_batch, 0, 1)
        # numpy views over the batch's arrays: filling them costs no Python loop per token.
        self._b_token = np.ctypeslib.as_array(self._batch.token, shape=(n_batch,))
        self._b_pos = np.ctypeslib.as_array(self._batch.pos, shape=(n_batch,))
        self._b_logits = np.ctypeslib.as_array(self._batch.logits, shape=(n_batch,))
        n_seq = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n_batch,))
        n_seq[:] = 1
        for i in range(n_batch):
            self._batch.seq_id[i][0] = 0
        self._b_seq = np.zeros(n_batch, dtype=np.int32)  # what the batch's seq_id entries hold
        self._owner, self._seq_id, self._ids = self, 0, []
        stat = path.stat()
        self.path = path
        self.name = name or path.name
        self.identity = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
        self.tokenizer = LlamaCppTokenizer(self._llm, C, template, self.name)
        self.capabilities = Capabilities(
            exact=False,
            device="cpu",
            dtype="gguf",
            max_branches=n_seq_max,
            num_slots=slots,
            batching=True,
            prefix_sharing=True,  # one unified KV cache: sequences share cells
            interruption=True,
        )
        self._slots: list[_SequenceOps] = [self, *(LlamaCppSequence(self, i) for i in range(1, slots))]
        # llama.cpp asks the abort callback between the graph's nodes (hundreds of Python calls
        # a forward, within timing noise of it); it is installed only inside `interruptible`.
        self._interrupt: Callable[[], bool] | None = None
        self._abort_cb = C.ggml_abort_callback(self._should_abort)

    # ---------------------------------------------------------------- interrupting
    def _should_abort(self, _data) -> bool:
        check = self._interrupt
        try:
            return bool(check is not None and check())
        except Exception:  # never raise into llama.cpp's compute loop
            return False

    @contextmanager
    def interruptible(self, check: Callable[[], bool]) -> Iterator[None]:
        """Forwards inside stop part-way once check() is true: llama_decode returns 2 (llama.cpp
        removes the ubatch it was computing from the cache), and _decode_items raises
        ForwardInterrupted after removing every position the call had added."""
        if self._interrupt is not None:
            raise BackendError("interruptible contexts do not nest")
        self._interrupt = check
        self._c.llama_set_abort_callback(self._ctx, self._abort_cb, None)
        try:
            yield
        finally:
            self._c.llama_set_abort_callback(self._ctx, self._c.ggml_abort_callback(), None)
            self._interrupt = None

    # ---------------------------------------------------------------- sequences
    @property
    def num_slots(self) -> int:
        return self.capabilities.num_slots

    def kv_bytes(self) -> dict[str, int]:
        """The whole cache: every cell reserved, and the positions every sequence holds (a prefix
        shared between slots by share_prefix counts once per sequence: an upper bound)."""
        if self._llm is None:
            return kv_figures(self._kv_token_bytes, 0, 0)
        used = sum(len(seq._ids) for seq in self._slots)
        return kv_figures(self._kv_token_bytes, self._kv_cells, min(used, self._kv_cells))

    def sequence(self, slot: int) -> _SequenceOps:
        return self._slots[slot]

    def extend_batch(self, items: Sequence[tuple[_SequenceOps, Sequence[int], int]]) -> list[np.ndarray]:
        for seq, _, _ in items:
            if not isinstance(seq, _SequenceOps) or seq._owner is not self:
                raise BackendError(f"{seq!r} is not a sequence of {self.name}")
        return self._decode_items(list(items))

    # ---------------------------------------------------------------- decoding
    def _decode_items(self, items: list[tuple[_SequenceOps, Sequence[int], int]]) -> list[np.ndarray]:
        """Decode every item's ids (sequence, ids, num_logits) in batches of n_batch rows;
        logits [num_logits, V] of each item's last positions."""
        if len({id(seq) for seq, _, _ in items}) != len(items):
            raise BackendError("a batch names the same sequence twice")
        tokens, pos, seqs, want = [], [], [], []
        for seq, ids, num_logits in items:
            start, n = len(seq._ids), len(ids)
            if start + n > seq._n_ctx:
                raise ContextOverflowError(f"{start + n} tokens exceed the context of {seq._n_ctx}")
            tokens.append(np.asarray(ids, dtype=np.int32))
            pos.append(np.arange(start, start + n, dtype=np.int32))
            seqs.append(np.full(n, seq._seq_id, dtype=np.int32))
            # Logits only where they are read: the output matrix costs ~2-7 ms per row here.
            want.append(np.arange(n) >= n - num_logits)
        tokens, pos, seqs, want = (np.concatenate(a) for a in (tokens, pos, seqs, want))
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= self._n_vocab):
            raise BackendError(f"token id outside the vocabulary of {self._n_vocab}")
        rows: list[np.ndarray] = []
        try:
            for offset in range(0, len(tokens), self._n_batch):
                if offset and self._should_abort(None):  # between a long prompt's batches
                    raise ForwardInterrupted("the forward was interrupted: its requests were cancelled")
                n = min(self._n_batch, len(tokens) - offset)
                chunk = slice(offset, offset + n)
                self._b_token[:n], self._b_pos[:n] = tokens[chunk], pos[chunk]
                for i in np.flatnonzero(self._b_seq[:n] != seqs[chunk]):
                    self._batch.seq_id[i][0] = int(seqs[offset + i])
                self._b_seq[:n] = seqs[chunk]
                self._b_logits[:n] = want[chunk]
                read = int(want[chunk].sum())
                if not read:
                    self._b_logits[n - 1] = 1  # llama.cpp expects at least one output per decode
                self._batch.n_tokens = n
                rc = self._c.llama_decode(self._ctx, self._batch)
                if rc == 2 and self._interrupt is not None:
                    raise ForwardInterrupted("the forward was interrupted: its requests were cancelled")
                if rc != 0:
                    raise BackendError(f"llama_decode failed with code {rc} at position {int(pos[offset])}")
                if read:
                    ptr = self._c.llama_get_logits(self._ctx)
                    rows.append(np.ctypeslib.as_array(ptr, shape=(read, self._n_vocab)).copy())  # [read, V]
        except BaseException:
            # Keep caches and bookkeeping in step: drop whatever this call decoded.
            for seq, _, _ in items:
                self._c.llama_memory_seq_rm(self._mem, seq._seq_id, len(seq._ids), -1)
            raise
        empty = np.zeros((0, self._n_vocab), np.float32)
        logits = rows[0] if len(rows) == 1 else np.concatenate(rows) if rows else empty
        out, at = [], 0
        for seq, ids, num_logits in items:
            seq._ids.extend(int(t) for t in ids)
            out.append(logits[at : at + num_logits])
            at += num_logits
        return out

    # ---------------------------------------------------------------- token trees
    def extend_tree(self, last: int, branches: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """One decode over a token trie: [last] shared by all branches, then each distinct
        branch prefix once, tagged with the sequence ids of the branches through it.
        Returns logits [1 + len(b), V] per branch; commit_branch() settles the cache."""
        num = len(branches)
        if num > self.n_seq_max:
            raise BackendError(f"{num} branches need n_seq_max >= {num} (this context has {self.n_seq_max})")
        base = len(self._ids)
        nodes: dict[tuple[int, ...], int] = {(): 0}
        order: list[tuple[int, ...]] = [()]
        for b in branches:
            for i in range(len(b)):
                prefix = tuple(int(t) for t in b[: i + 1])
                if prefix not in nodes:
                    nodes[prefix] = len(order)
                    order.append(prefix)
        n = len(order)
        if base + n > self._n_ctx:
            raise ContextOverflowError(f"{base + n} tokens exceed the context of {self._n_ctx}")
        if n > self._n_batch:
            raise BackendError(f"a tree of {n} tokens exceeds the batch size {self._n_batch}")
        if self._tree_batch is None:
            self._tree_batch = self._c.llama_batch_init(self._n_batch, 0, self.n_seq_max)
        batch = self._tree_batch
        for j, prefix in enumerate(order):
            members = [s for s, b in enumerate(branches) if tuple(b[: len(prefix)]) == prefix]
            batch.token[j] = int(last) if not prefix else prefix[-1]
            batch.pos[j] = base + len(prefix)
            batch.n_seq_id[j] = len(members)
            for m, seq in enumerate(members):
                batch.seq_id[j][m] = seq
            batch.logits[j] = 1
        batch.n_tokens = n
        mem = self._mem
        for seq in range(1, num):
            self._c.llama_memory_seq_cp(mem, 0, seq, -1, -1)  # share the prefix: no copy of data
        rc = self._c.llama_decode(self._ctx, batch)
        if rc != 0:
            self._drop_tree(base, num)
            raise BackendError(f"llama_decode failed with code {rc} on a tree of {n} tokens")
        logits = np.ctypeslib.as_array(self._c.llama_get_logits(self._ctx), shape=(n, self._n_vocab))
        out = []
        for b in branches:
            rows = [0] + [nodes[tuple(int(t) for t in b[: i + 1])] for i in range(len(b))]
            out.append(logits[rows].copy())  # [1 + len(b), V]
        self._pending_tree = (base, int(last), [list(map(int, b)) for b in branches])
        return out

    def commit_branch(self, branch: int, num_accepted: int) -> None:
        """Keep [last] + branches[branch][:num_accepted] as sequence 0; drop everything else."""
        base, last, branches = self._pending_tree
        self._pending_tree = None
        keep = base + 1 + num_accepted
        mem, c = self._mem, self._c
        ok = c.llama_memory_seq_rm(mem, -1, keep, -1)
        if branch != 0:
            ok &= c.llama_memory_seq_rm(mem, 0, base + 1, -1)
            c.llama_memory_seq_cp(mem, branch, 0, base + 1, keep)
        for seq in range(1, len(branches)):
            ok &= c.llama_memory_seq_rm(mem, seq, -1, -1)
        self._ids = self._ids[:base] + [last] + branches[branch][:num_accepted]
        if not ok:
            self.reset()
            raise BackendError("llama.cpp refused to remove the rejected branches from the cache")

    def _drop_tree(self, base: int, num: int) -> None:
        self._c.llama_memory_seq_rm(self._mem, 0, base, -1)
        for seq in range(1, num):
            self._c.llama_memory_seq_rm(self._mem, seq, -1, -1)

    def reset(self) -> None:
        """Forget sequence 0's cache (with slots, the others keep theirs)."""
        if len(self._slots) > 1:
            self._c.llama_memory_seq_rm(self._mem, 0, -1, -1)
        else:
            self._c.llama_memory_clear(self._mem, True)
        self._ids.clear()

    def close(self) -> None:
        if self._batch is not None:
            self._c.llama_batch_free(self._batch)
            self._batch = None
        if self._tree_batch is not None:
            self._c.llama_batch_free(self._tree_batch)
            self._tree_batch = None
        if self._own_ctx:
            self._c.llama_free(self._own_ctx)
            self._own_ctx = None
        if self._llm is not None:
            self._llm.close()
            self._llm = None
            release_memory()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
