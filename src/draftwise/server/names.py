"""The names a served model answers to, decided once for every route: its served name, Ollama's
spellings of it (with and without `:latest`), its file's stem, and whatever else its stores call
it (catalog.py gathers those). Also how an error quotes a name a client sent and lists the names
served: both capped, since a client's name may be of any length and a server may serve hundreds.

Example: spellings("models/alpha.gguf") -> ("models/alpha.gguf:latest", "alpha.gguf",
"alpha.gguf:latest", "alpha", "alpha:latest").
"""

from __future__ import annotations

from collections.abc import Iterable

_QUOTED_CHARS = 100
_LISTED_NAMES = 10
_LATEST = ":latest"


def tag_forms(name: str) -> tuple[str, ...]:
    """Ollama's other spelling: "m" <-> "m:latest"; a name with another tag has none."""
    if name.endswith(_LATEST):
        return (name[: -len(_LATEST)],)
    return () if ":" in name.rsplit("/", 1)[-1] else (f"{name}{_LATEST}",)


def spellings(name: str) -> tuple[str, ...]:
    """The other names a model of served name `name` answers to, on every route: the tag forms,
    and for a file's name (a path under a folder, LM Studio's publisher/repo/file.gguf) the file's
    name and its stem, each with its tag forms. Ollama's names ("user/model:tag") keep their path."""
    out = [*tag_forms(name)]
    base = name[: -len(_LATEST)] if name.endswith(_LATEST) else name
    if base.endswith(".gguf"):
        file = base.rsplit("/", 1)[-1]
        for short in dict.fromkeys((file, file[: -len(".gguf")])):
            if short and short != base:
                out += [short, *tag_forms(short)]
    return tuple(n for n in dict.fromkeys(out) if n != name)


def answers_to(requested: str | None, name: str, names: Iterable[str] = ()) -> bool:
    """Whether a request's `model` names the model served as `name`, which also answers to
    `names` (its stores' other names)."""
    if not requested:
        return False
    return requested == name or requested in spellings(name) or requested in names


def quoted(requested: object) -> str:
    """A client's model name as an error quotes it: repr'd, at most 100 characters of it."""
    text = requested if isinstance(requested, str) else str(requested)
    if len(text) <= _QUOTED_CHARS:
        return repr(text)
    return f"{text[:_QUOTED_CHARS]!r}… ({len(text)} characters)"


def listing(served: Iterable[str]) -> str:
    """The served names as an error lists them: the first ten, then how many more."""
    names = list(served)
    shown = ", ".join(names[:_LISTED_NAMES])
    more = len(names) - _LISTED_NAMES
    return f"{shown} and {more} more (GET /v1/models lists them)" if more > 0 else shown
