"""The error types the CLI and the server map to messages and statuses.

A leaf: it imports nothing from draftwise, so any module may raise these, and the modules
that raise them re-export them (`from draftwise.types import ConfigError` keeps working).
The CLI prints `error: <message>` and exits 2 (cli/__init__.py); the server answers 400
with an OpenAI error code for a bad request (server/app.py).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is out of range; the message names the field."""


class ConstraintError(ConfigError):
    """A schema, regex or grammar that the structured-output library refuses (its message)."""


class PromptTooLongError(ConfigError):
    """The prompt leaves no room in the context window."""


class TokenizerMismatchError(ValueError):
    """Draft and target do not share a tokenizer."""


class BackendError(RuntimeError):
    """The inference library failed (decode error, failed cache removal, ...)."""


class ContextOverflowError(BackendError):
    """More tokens than the context window holds."""


class ForwardInterrupted(BackendError):
    """A forward was stopped part-way because every request in it was cancelled (an editor's
    request superseded); the caches hold what they held before it."""


class ModelError(RuntimeError):
    """A model could not be found, fetched or verified."""
