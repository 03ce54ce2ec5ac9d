"""Which chat template a GGUF model answers chat with, and llama.cpp's built-in ones by name.

In order: the one the user names (`--chat-template NAME`, one of llama.cpp's built-in templates,
or `--chat-template FILE`, a Jinja file), the GGUF's own (`tokenizer.chat_template`), else the
family's default: the built-in template whose turn markers the vocabulary holds as tokens
("<start_of_turn>" -> gemma, "<|im_start|>" -> chatml), or the architecture's (gemma3 -> gemma).
A built-in template is rendered by llama.cpp itself (llama_chat_apply_template), as llama-server
and llama-cli render it.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from draftwise.errors import ConfigError

# Turn markers a vocabulary holds as single tokens -> the built-in template that writes them;
# the first match wins (Llama 3 before ChatML: a few Llama-3 tunes carry both).
MARKER_TEMPLATES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|start_header_id|>", "<|eot_id|>"), "llama3"),
    (("<start_of_turn>", "<end_of_turn>"), "gemma"),
    (("<|im_start|>", "<|im_end|>"), "chatml"),
    (("<｜User｜>", "<｜Assistant｜>"), "deepseek3"),
    (("[SYSTEM_PROMPT]", "[INST]"), "mistral-v7"),
    (("[INST]", "[/INST]"), "mistral-v3"),
    (("<|user|>", "<|assistant|>", "<|end|>"), "phi3"),
)
# general.architecture -> the built-in template of the family, where the architecture says it
# (a Llama-architecture model may be any of several families, so "llama" has none).
ARCHITECTURE_TEMPLATES: dict[str, str] = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
    "qwen2": "chatml",
    "qwen2moe": "chatml",
    "qwen3": "chatml",
    "qwen3moe": "chatml",
    "phi3": "phi3",
    "command-r": "command-r",
    "deepseek2": "deepseek2",
    "exaone": "exaone3",
    "granite": "granite",
    "chatglm": "chatglm4",
}


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template: Jinja source, or a built-in template's name (rendered by
    llama.cpp); origin says where it came from ("metadata", "--chat-template", "family")."""

    origin: str
    jinja: str | None = None
    builtin: str | None = None

    def describe(self) -> str:
        """'gguf', 'gemma (family default)', 'chatml (--chat-template)', 'template.jinja (--chat-template)'."""
        if self.origin == "metadata":
            return "gguf"
        what = self.builtin or "jinja file"
        return f"{what} ({'family default' if self.origin == 'family' else self.origin})"


@functools.cache
def builtin_names() -> tuple[str, ...]:
    """llama.cpp's built-in template names (llama_chat_builtin_templates)."""
    from llama_cpp import llama_cpp as C

    n = C.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * n)()
    C.llama_chat_builtin_templates(names, n)
    return tuple(sorted(name.decode() for name in names))


def named_template(value: str) -> ChatTemplate:
    """--chat-template's value: a Jinja file, else a built-in name. Raises ConfigError naming
    the built-in names when it is neither."""
    path = Path(value).expanduser()
    if path.is_file():
        try:
            return ChatTemplate("--chat-template", jinja=path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--chat-template: cannot read {path}: {exc}") from exc
    if value in builtin_names():
        return ChatTemplate("--chat-template", builtin=value)
    raise ConfigError(
        f"--chat-template: {value!r} is neither a Jinja file nor one of llama.cpp's built-in templates "
        f"({', '.join(builtin_names())})"
    )


def family_template(architecture: str, has_token: Callable[[str], bool]) -> str | None:
    """The built-in template of the model's family: by the turn markers its vocabulary holds as
    tokens, else by its architecture; None when neither says. Example: ("gemma3", a vocabulary
    with "<start_of_turn>") -> "gemma"."""
    for markers, name in MARKER_TEMPLATES:
        if all(has_token(m) for m in markers):
            return name
    return ARCHITECTURE_TEMPLATES.get(architecture)


def choose_template(
    override: ChatTemplate | None, metadata_template: str | None, architecture: str, has_token: Callable[[str], bool]
) -> ChatTemplate | None:
    """The template to answer chat with (see the module's docstring), None when there is none."""
    if override is not None:
        return override
    if metadata_template:
        return ChatTemplate("metadata", jinja=metadata_template)
    name = family_template(architecture, has_token)
    return ChatTemplate("family", builtin=name) if name else None


def _content_text(content) -> str:
    """A message's content as one string: OpenAI's list of parts is its text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def render_builtin(name: str, messages: Sequence[dict], *, add_generation_prompt: bool) -> str:
    """The prompt llama.cpp's built-in template `name` writes for messages (role and content;
    what a built-in template has no place for, such as tool calls, is left out)."""
    from llama_cpp import llama_cpp as C

    encoded = [(str(m.get("role", "user")).encode(), _content_text(m.get("content")).encode()) for m in messages]
    chat = (C.llama_chat_message * max(1, len(encoded)))()
    for i, (role, content) in enumerate(encoded):
        chat[i].role, chat[i].content = role, content
    size = 256 + 2 * sum(len(r) + len(c) for r, c in encoded)
    for _ in range(2):  # the second time with the size the first one asked for
        buf = ctypes.create_string_buffer(size)
        n = C.llama_chat_apply_template(name.encode(), chat, len(encoded), add_generation_prompt, buf, size)
        if n < 0:
            raise ConfigError(f"llama.cpp does not know the chat template {name!r}")
        if n <= size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n
    raise ConfigError(f"llama.cpp's chat template {name!r} did not fit its buffer")
