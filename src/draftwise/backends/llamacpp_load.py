"""Loading and freeing a llama.cpp model and its context, leaving the process's stdout and stderr
alone and giving the memory back.

llama-cpp-python quiets a load (`Llama(verbose=False)`) by pointing file descriptors 1 and 2 at
/dev/null around it: process-wide, so two loads in parallel threads can each restore the other's
/dev/null and leave a server's log there for good (issue 67). Here nothing is swapped: llama.cpp's
own log goes to the `draftwise.llamacpp` logger through its log callback, and the model is made
through llama-cpp-python's thin wrapper with verbose on, which skips the swap. `LlamaModelContext`
offers what `Llama` gave the backend (the model, a context, tokenizer calls, metadata) and none of
what it does not read (a score buffer of n_batch x n_vocab, a batch of n_ctx sequences).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
import threading
from collections.abc import Sequence

logger = logging.getLogger("draftwise.llamacpp")

# ggml log levels (ggml.h): none, debug, info, warn, error, cont (the previous line goes on).
_GGML_ERROR, _GGML_CONT = 4, 5


class _LlamaLog:
    """llama.cpp's log routed to Python logging, installed once per process. Errors are warnings
    (the caller raises its own error for what failed); everything else is debug."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callback = None  # the ctypes function: kept alive as long as llama.cpp may call it
        self._last_level = 0

    def install(self, C) -> None:
        with self._lock:
            if self._callback is not None:
                return
            self._callback = C.llama_log_callback(self._log)
            C.llama_log_set(self._callback, ctypes.c_void_p(0))
            C.llama_backend_init()

    def _log(self, level: int, text: bytes | None, _user_data) -> None:
        try:
            if level != _GGML_CONT:
                self._last_level = level
            python_level = logging.WARNING if self._last_level == _GGML_ERROR else logging.DEBUG
            if text and logger.isEnabledFor(python_level):
                line = text.decode("utf-8", errors="replace").rstrip("\n")
                if line:
                    logger.log(python_level, "%s", line)
        except Exception:  # never raise into llama.cpp
            pass


_LLAMA_LOG = _LlamaLog()


def _glibc_trim() -> None:
    """Give the allocator's free pages back to the system. glibc keeps what llama.cpp frees (a KV
    cache, compute buffers below its adaptive mmap threshold, up to 32 MiB) in its arenas, one per
    thread that allocated, and returns only the top of each heap on its own."""
    if not sys.platform.startswith("linux"):
        return
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        pass


def release_memory() -> None:
    """What an unloaded model left behind, back to the system (call after closing one)."""
    _glibc_trim()


class LlamaModelContext:
    """A GGUF model (memory-mapped weights, CPU) and one llama.cpp context over it, made without
    touching stdout or stderr. The settings are `Llama`'s defaults (no GPU layers, flash attention
    off, its rope and yarn values), so a model answers as it did under `Llama`.
    Raises ValueError when llama.cpp cannot load the file or make the context."""

    def __init__(self, path: str, *, n_ctx: int, n_batch: int, n_threads: int) -> None:
        from llama_cpp import _internals
        from llama_cpp import llama_cpp as C

        _LLAMA_LOG.install(C)
        self._c = C
        self.ctx = None
        model_params = C.llama_model_default_params()
        model_params.n_gpu_layers, model_params.split_mode, model_params.main_gpu = 0, C.LLAMA_SPLIT_MODE_LAYER, 0
        model_params.vocab_only, model_params.load_mode = False, C.LLAMA_LOAD_MODE_MMAP
        # verbose=True only skips the descriptor swap: the log callback above decides what is shown.
        self._model = _internals.LlamaModel(path_model=path, params=model_params, verbose=True)
        self.model = self._model.model
        self.context_params = llama_context_params(C, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
        self.ctx = C.llama_init_from_model(self.model, self.context_params)
        if not self.ctx:
            self.close()
            raise ValueError(f"llama.cpp could not create a context of {n_ctx} tokens for {path}")
        self.metadata = self._model.metadata()

    def n_vocab(self) -> int:
        return self._model.n_vocab()

    def token_bos(self) -> int:
        return self._model.token_bos()

    def token_eos(self) -> int:
        return self._model.token_eos()

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return self._model.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return self._model.detokenize(list(tokens))

    def close(self) -> None:
        """Free the context, then the model (idempotent)."""
        if self.ctx:
            self._c.llama_free(self.ctx)
        self.ctx = None
        model, self._model = getattr(self, "_model", None), None
        if model is not None:
            model.close()
        self.model = None


def llama_context_params(C, *, n_ctx: int, n_batch: int, n_threads: int):
    """`Llama`'s context settings for these sizes (where they differ from llama.cpp's defaults:
    flash attention off, yarn's attention factor 1 and betas 32 and 1, performance counters on)."""
    params = C.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = params.n_ubatch = min(n_ctx, n_batch)
    params.n_threads = params.n_threads_batch = n_threads
    params.rope_scaling_type = C.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED
    params.pooling_type = C.LLAMA_POOLING_TYPE_UNSPECIFIED
    params.attention_type = C.LLAMA_ATTENTION_TYPE_UNSPECIFIED
    params.rope_freq_base = params.rope_freq_scale = 0.0
    params.yarn_ext_factor, params.yarn_attn_factor = -1.0, 1.0
    params.yarn_beta_fast, params.yarn_beta_slow, params.yarn_orig_ctx = 32.0, 1.0, 0
    params.embeddings, params.offload_kqv = False, True
    params.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.no_perf = False
    return params


def init_context(C, model, params, what: str):
    """A further context over a loaded model (llama_init_from_model, whose log goes to the
    callback like the load's). Raises ValueError naming `what` when llama.cpp refuses."""
    _LLAMA_LOG.install(C)
    ctx = C.llama_init_from_model(model, params)
    if not ctx:
        raise ValueError(f"llama.cpp could not create {what}")
    return ctx
