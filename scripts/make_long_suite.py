#!/usr/bin/env python
"""Build the bench's `long` suite (src/draftwise/bench/suites/long.jsonl): long contexts and long answers.

Three context bundles of about 8,000, 16,000 and 28,000 tokens (each within 5% of its target, by
the default target's tokenizer), each a few whole source files of one package of the Python
standard library given as "retrieved documents": a header line naming the file, then the file in a
fenced code block. Several tasks are posed on the same bundle, the bundle first in the user
message and the task after it, so the prompts of one bundle share their prefix token for token and
the engine reuses the bundle's cache; they are adjacent in the file, in the order rag, code, edit:

- long_rag (3): a question answered from the documents, about definitions in the bundle's last third.
- long_code (3): a code task over the bundle (write a function using its API, or explain and quote).
- long_edit (2, the 16k and 28k bundles): one edit (rename, or add_parameter as the corpus makes it,
  bench/corpus/edits.py) of a 30-120 line function in the bundle's last quarter; `reference` is the
  edited function in a code block.
- long_output (2): a ~4,500-token source file to write out again unchanged, and a tutorial of at
  least 3,500 words; 4,096 answer tokens each.
- long_chat (1): a 40-turn coding session, 64 answer tokens a turn, its history kept.

Each record has `max_tokens`, `source` (the files) and `licence`; bundle records also `context_label`
("8k", "16k", "28k"). The files are fixed below; the same installed files write the same suite, byte
for byte. The script checks the sizes, positions and shared prefixes and stops with a message if a
check fails. The files and their licences are listed in suites/README.md.

    scripts/make_long_suite.py [--out src/draftwise/bench/suites/long.jsonl] [--model PATH]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from draftwise.bench.corpus.build import fenced
from draftwise.bench.corpus.code import FUNCTIONS, Region, definition_text, parses
from draftwise.bench.corpus.edits import add_parameter, replace_word, words
from draftwise.bench.corpus.sources import Source, language_of, provenance, read_source
from draftwise.models import DEFAULT_TARGET, model_path

FIRST_ID = 1101
OUT = "src/draftwise/bench/suites/long.jsonl"
DEFAULT_MODEL = model_path(DEFAULT_TARGET)  # ~/.cache/draftwise/models/qwen2.5-coder-1.5b-instruct.gguf
STDLIB = Path(sysconfig.get_paths()["stdlib"])
NPM = Path("/usr/lib/node_modules/npm/node_modules")
N_CTX = 32_768  # the window the suite needs (--n-ctx 32768)
TOLERANCE = 0.05  # a bundle's size within 5% of its target
BUNDLE_ANSWER = {"long_rag": 256, "long_code": 256, "long_edit": 1024}
LONG_ANSWER, CHAT_ANSWER = 4096, 64
END = "=== end of the documents ==="  # the last line of every bundle; the task follows it
PROJECT = ("written for this project", "Apache-2.0")


@dataclass(frozen=True)
class Edit:
    """The long_edit task of a bundle: `kind` "rename" (old -> new) or "add_parameter" (seeded)."""

    path: str
    function: str
    kind: str
    old: str = ""
    new: str = ""


@dataclass(frozen=True)
class Bundle:
    """A context: files of one stdlib package, and the tasks posed on it.

    `anchors` are texts of the definitions the rag answer needs; each must occur once in the
    bundle, in its last third."""

    label: str
    target: int
    package: str
    files: tuple[str, ...]
    rag: str
    anchors: tuple[str, ...]
    code: str
    edit: Edit | None = None


BUNDLES = (
    Bundle(
        "8k",
        8_000,
        "json",
        ("json/__init__.py", "json/scanner.py", "json/decoder.py", "json/tool.py"),
        rag=(
            "Using the documents above, explain how `JSONDecoder.decode` rejects a string that has "
            "more text after the JSON document, and how `raw_decode` tells its caller where the "
            "document ended. Name the functions and methods involved, in the order they run."
        ),
        anchors=("    def decode(self, s, _w=WHITESPACE.match):", "    def raw_decode(self, s, idx=0):"),
        code=(
            "Using `JSONDecoder.raw_decode` and the `WHITESPACE` pattern from `json/decoder.py` above, "
            "write a generator function `iter_documents(text)` that yields, in order, each JSON value "
            "of a string holding several JSON documents separated by whitespace (as in a JSON Lines "
            "file), and lets `JSONDecodeError` propagate for malformed input. Reply with the function "
            "in one code block, then one sentence on how it finds where each document ends."
        ),
    ),
    Bundle(
        "16k",
        16_000,
        "email",
        ("email/__init__.py", "email/parser.py", "email/message.py", "email/iterators.py", "email/utils.py"),
        rag=(
            "Using the documents above, explain how `email.utils.localtime` turns a naive datetime "
            "into an aware one: what the `isdst` argument changes, how the UTC offset and the zone "
            "name are found, and what it falls back to when the platform's time tuple has no "
            "`tm_gmtoff`. Name the functions involved."
        ),
        anchors=("def localtime(dt=None, isdst=-1):",),
        code=(
            "In `email/utils.py` above, what does `format_datetime` return for a naive datetime (one "
            "without tzinfo), and what does it do when `usegmt` is true but the datetime is not in "
            "UTC? Quote the lines of the function that decide each case, then name the helper that "
            "builds the final string."
        ),
        edit=Edit("email/utils.py", "decode_params", "rename", "params", "pairs"),
    ),
    Bundle(
        "28k",
        28_000,
        "asyncio",
        (
            "asyncio/events.py",
            "asyncio/futures.py",
            "asyncio/locks.py",
            "asyncio/queues.py",
            "asyncio/streams.py",
            "asyncio/tasks.py",
        ),
        rag=(
            "Using the documents above, explain what `gather` does when one of its awaitables raises "
            "while `return_exceptions` is false, and what happens to the children when the future "
            "that `gather` returns is cancelled. Name the functions and methods involved."
        ),
        anchors=("def gather(*coros_or_futures, return_exceptions=False):", "class _GatheringFuture("),
        code=(
            "Using `open_connection` from `asyncio/streams.py`, `StreamReader.readline` and "
            "`StreamWriter.close` / `wait_closed`, and `wait_for` from `asyncio/tasks.py` above, write "
            "an async function `read_banner(host, port, timeout=5.0)` that connects to a server, "
            "reads the first line it sends, always closes the connection, and returns the line "
            "decoded as UTF-8 without its line ending, or None if nothing arrives within `timeout` "
            "seconds. Reply with the function in one code block."
        ),
        edit=Edit("asyncio/tasks.py", "wait_for", "add_parameter"),
    ),
)

COPY_FILE = (NPM, "pacote/lib/fetcher.js")  # about 4,500 tokens
TUTORIAL = (
    "Write a detailed tutorial (at least 3,500 words) on Python's asyncio for a developer who knows "
    "Python but has never written asynchronous code. Cover the event loop, coroutines and `await`, "
    "tasks and `gather`, cancellation and timeouts, locks, events and semaphores, queues and the "
    "producer/consumer pattern, streams for a small TCP client and server, running blocking code "
    "with `to_thread`, and how to test and debug asyncio programs. Use a heading for each section, "
    "explain each idea in prose first, keep code examples short, and end with a list of common "
    "mistakes and how to avoid them."
)
CHAT = (
    "Let's build a small Python module, `todo.py`, that keeps a to-do list in a JSON file. Start "
    "with a `Task` dataclass (id, title, done, created) and the functions `load(path)` and "
    "`save(tasks, path)`.",
    "Add `add_task(tasks, title)` that gives the new task the next free id and returns it.",
    "Now `complete(tasks, task_id)`; raise a KeyError with a helpful message if the id is unknown.",
    "What does `load` do if the file does not exist yet? Make it return an empty list then.",
    "Store `created` as an ISO 8601 string in the file but keep it a datetime in the dataclass.",
    "Write pytest tests for `add_task` and `complete`.",
    "Use the `tmp_path` fixture to test that `save` followed by `load` gives the same tasks back.",
    "That round-trip test fails on my machine only sometimes. Could the `created` timestamps be the reason?",
    "Add an optional `due` field, a date.",
    "Add `overdue(tasks, today)` returning the unfinished tasks whose due date is before today.",
    "Test `overdue` with one task due yesterday, one due today and one without a due date.",
    "Now a command-line interface with argparse: `todo add TITLE`, `todo done ID` and `todo list`.",
    "Make `todo list` mark done tasks with a check mark and print overdue ones in red when stdout is a terminal.",
    "Where should the JSON file live by default? Use `~/.todo.json` unless `TODO_FILE` is set.",
    "Why did you use `os.environ.get` there rather than `os.environ[...]`?",
    "Add `--due YYYY-MM-DD` to `todo add`, with a clear error message for a bad date.",
    "A crash halfway through `save` can lose the list. Make it write a temporary file and rename it.",
    "Why is `os.replace` better than `os.rename` for that?",
    "Add tags: `todo add TITLE --tag work --tag home`, stored as a list.",
    "`todo list --tag work` should show only the tasks with that tag.",
    "Write a test for the tag filter that goes through `main(argv)`.",
    "Refactor: move the printing out of `main` into `format_task(task, color)`.",
    "Test `format_task` with and without color.",
    "Add `todo remove ID`, which asks for confirmation unless `--yes` is given.",
    "How would you test that confirmation prompt without typing anything? Show the test.",
    "Sort `todo list` by due date, tasks without one last, then by id.",
    "Can `overdue` from earlier reuse that sort key? Update it.",
    "Add type hints everywhere. What would mypy still complain about?",
    "Replace the plain list with a `TodoList` class that holds the tasks and the path, with add, "
    "complete, remove and save methods.",
    "Update the tests we wrote so far to use `TodoList`.",
    "Add `todo edit ID --title NEW` to rename a task.",
    "Two terminals running `todo add` at the same time can lose a task. Explain the race and add a file lock.",
    "Does that lock work on Windows too? If not, what would you use there?",
    "Add `todo export --format csv`, writing the tasks to stdout.",
    "Test the CSV export with a title that contains a comma and a double quote.",
    "Add a `--version` flag that reads the version from the package metadata.",
    "Write a `pyproject.toml` so that `pip install .` gives a `todo` command.",
    "Summarise the module's public functions and classes as they stand now, one line each.",
    "Write a short README section on usage, with an example of every command.",
    "Last one: which three things would you improve next, and why?",
)


class Failed(Exception):
    """A check failed; the message says which."""


class Tokens:
    """The target's tokenizer (vocabulary only) and its chat template."""

    def __init__(self, model: Path) -> None:
        if not model.is_file():
            raise Failed(
                f"tokenizer model not found: {model} (the default target's GGUF: fetch it with "
                f"`draftwise pull {DEFAULT_TARGET}`, or pass --model PATH)"
            )
        import llama_cpp

        from draftwise.backends.llamacpp import LlamaCppTokenizer

        llm = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
        self.tokenizer = LlamaCppTokenizer(llm, llama_cpp)

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special=False, parse_special=False)

    def count(self, text: str) -> int:
        return len(self.ids(text))

    def chat(self, text: str) -> int:
        """The tokens of a one-turn request with the chat template (as the bench sends it)."""
        prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        return len(self.tokenizer.encode(prompt, add_special=True, parse_special=True))


def read(root: Path, path: str) -> str:
    """A source file's text, through the corpus's checks (UTF-8, short lines, not generated)."""
    full = root / path
    text = read_source(Source(full, root, language_of(full)))
    if text is None:
        raise Failed(f"{full}: missing or not usable (corpus_sources.read_source)")
    if "```" in text:
        raise Failed(f"{full}: holds a code fence, which would end its block")
    return text


def licence_of(root: Path, paths: tuple[str, ...]) -> str:
    """The one licence of the files (corpus_sources.provenance)."""
    licences = sorted({provenance(root / p)[1] for p in paths})
    if len(licences) != 1 or licences[0] == "unknown":
        raise Failed(f"{paths}: expected one known licence, found {licences}")
    return licences[0]


def bundle_text(bundle: Bundle) -> str:
    """The documents, then END and a blank line: the prefix every task of the bundle shares."""
    parts = [
        f"The documents below are source files of the `{bundle.package}` package of the Python "
        f"{platform.python_version()} standard library, retrieved for the request that follows them.\n\n"
    ]
    for i, path in enumerate(bundle.files, start=1):
        body = read(STDLIB, path).rstrip("\n")
        parts.append(f"Document {i} of {len(bundle.files)}: {path}\n{fenced('python', body)}\n\n")
    parts.append(f"{END}\n\n")
    return "".join(parts)


def position(tokens: Tokens, text: str, needle: str, total: int) -> float:
    """Where the one occurrence of `needle` starts, as a share of the text's tokens."""
    if text.count(needle) != 1:
        raise Failed(f"{needle!r} occurs {text.count(needle)} times in the bundle, not once")
    return tokens.count(text[: text.index(needle)]) / total


def function_of(path: str, name: str) -> tuple[str, int, int]:
    """A top-level function's text (decorators included) and its 1-based first and last lines."""
    text = read(STDLIB, path)
    lines = text.split("\n")
    for node in ast.parse(text).body:
        if isinstance(node, FUNCTIONS) and node.name == name:
            body = definition_text(node, lines)
            return body, node.end_lineno - body.count("\n"), node.end_lineno
    raise Failed(f"{path}: no top-level function {name}")


def edit_task(edit: Edit) -> tuple[str, str, str]:
    """(instruction, edited function, "PATH:FIRST-LAST") for a bundle's edit."""
    original, first, last = function_of(edit.path, edit.function)
    if not 30 <= last - first + 1 <= 120:
        raise Failed(f"{edit.path}:{edit.function} has {last - first + 1} lines, not 30-120")
    where = f"the function `{edit.function}` in `{edit.path}`"
    if edit.kind == "rename":
        if words(original, edit.old) < 3 or words(original, edit.new):
            raise Failed(f"{edit.function}: cannot rename {edit.old} to {edit.new}")
        instruction = (
            f"Rename the parameter `{edit.old}` of {where} to `{edit.new}`, everywhere in the function "
            "(its docstring too)."
        )
        text = replace_word(original, edit.old, edit.new)
    else:
        made = add_parameter(Region(first - 1, last - 1, original, ()), "python", random.Random(edit.function))
        if made is None:
            raise Failed(f"{edit.function}: add_parameter found nothing to do")
        instruction = made.instruction.replace(f"to `{edit.function}`", f"to {where}")
        text = made.text
    if text == original or not parses(text):
        raise Failed(f"{edit.function}: the edit changed nothing or does not parse")
    instruction += (
        " Keep everything else, docstring and comments included, as it is. Reply with the whole updated "
        "function only, in one code block."
    )
    return instruction, fenced("python", text), f"{edit.path}:{first}-{last}"


def bundle_records(bundle: Bundle, tokens: Tokens, report: list[str]) -> list[dict]:
    """The rag, code and (where set) edit prompts of one bundle, in that order."""
    context = bundle_text(bundle)
    size = tokens.count(context)
    if abs(size - bundle.target) > TOLERANCE * bundle.target:
        raise Failed(f"the {bundle.label} bundle has {size} tokens, not {bundle.target} within 5%")
    for anchor in bundle.anchors:
        if position(tokens, context, anchor, size) < 2 / 3:
            raise Failed(f"the {bundle.label} rag question's {anchor!r} is not in the bundle's last third")
    common = {
        "source": list(bundle.files),
        "licence": licence_of(STDLIB, bundle.files),
        "language": "python",
        "context_label": bundle.label,
    }
    records = [
        {"category": "long_rag", "turns": [context + bundle.rag], **common},
        {"category": "long_code", "turns": [context + bundle.code], **common},
    ]
    if bundle.edit is not None:
        instruction, reference, edited = edit_task(bundle.edit)
        original = function_of(bundle.edit.path, bundle.edit.function)[0]
        if position(tokens, context, original, size) < 0.75:
            raise Failed(f"{edited} is not in the {bundle.label} bundle's last quarter")
        edit = {"category": "long_edit", "turns": [context + instruction], "reference": reference}
        records.append({**edit, **common, "edited": edited})
    ids = [tokens.ids(r["turns"][0]) for r in records]
    shared = min(len(os.path.commonprefix([ids[0], other])) for other in ids[1:])
    if shared < size - 2:
        raise Failed(f"the {bundle.label} prompts share {shared} tokens, fewer than the bundle's {size}")
    report.append(f"bundle {bundle.label}: {size} tokens, prompts share {shared}")
    for r in records:
        r["max_tokens"] = BUNDLE_ANSWER[r["category"]]
    return records


def copy_record() -> dict:
    root, path = COPY_FILE
    text = read(root, path).rstrip("\n")
    package = json.loads((root / path.split("/")[0] / "package.json").read_text(encoding="utf-8"))
    prompt = (
        f"Here is `{path.split('/', 1)[1]}` from the npm package {package['name']} {package['version']}:\n\n"
        f"{fenced('javascript', text)}\n\n"
        "Write out this file again unchanged, from its first line to its last, in one code block: "
        "no line added, dropped or changed."
    )
    return {
        "category": "long_output",
        "turns": [prompt],
        "reference": fenced("javascript", text),
        "source": [path],
        "licence": licence_of(root, (path,)),
        "language": "javascript",
        "max_tokens": LONG_ANSWER,
    }


def build(tokens: Tokens, report: list[str]) -> list[dict]:
    records = [r for bundle in BUNDLES for r in bundle_records(bundle, tokens, report)]
    records.append(copy_record())
    records.append(
        {
            "category": "long_output",
            "turns": [TUTORIAL],
            "source": [PROJECT[0]],
            "licence": PROJECT[1],
            "max_tokens": LONG_ANSWER,
        }
    )
    if len(CHAT) != 40:
        raise Failed(f"long_chat has {len(CHAT)} turns, not 40")
    conversation = sum(tokens.chat(turn) + CHAT_ANSWER for turn in CHAT)  # a bound: every turn's template
    if conversation > N_CTX:
        raise Failed(f"long_chat needs up to {conversation} tokens, over {N_CTX}")
    report.append(f"long_chat: the whole conversation at most {conversation} tokens")
    records.append(
        {
            "category": "long_chat",
            "turns": list(CHAT),
            "source": [PROJECT[0]],
            "licence": PROJECT[1],
            "max_tokens": CHAT_ANSWER,
        }
    )
    out = []
    for i, r in enumerate(records):
        first = r["turns"][0]
        window = tokens.chat(first) + r["max_tokens"]
        if window > N_CTX:
            raise Failed(f"{r['category']} ({r.get('context_label', '')}) needs {window} tokens, over {N_CTX}")
        report.append(
            f"{FIRST_ID + i}  {r['category']:<12} {r.get('context_label', ''):>4}  first turn {tokens.count(first):>6}"
            f" tokens  with template + answer {window:>6}"
        )
        out.append({"question_id": FIRST_ID + i, **r})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="the GGUF whose tokenizer counts tokens")
    args = parser.parse_args()
    report: list[str] = []
    try:
        records = build(Tokens(args.model), report)
    except Failed as exc:
        sys.exit(f"make_long_suite: {exc}")
    with open(args.out, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    print("\n".join(report))
    print(f"{len(records)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
