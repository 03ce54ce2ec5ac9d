"""Backends: one per inference library (llama.cpp, transformers) plus exact toy tables."""

from draftwise.backends.base import Backend, BackendError, Capabilities, ContextOverflowError, Tokenizer

__all__ = ["Backend", "BackendError", "Capabilities", "ContextOverflowError", "Tokenizer"]
