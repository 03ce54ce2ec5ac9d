"""A development corpus: benchmark tasks generated from the source files installed on a machine,
split by file into a `dev` half to tune on and a `test` half to report on.

Three kinds of task, each a Spec-Bench prompt dict that bench/suites/prompts.py loads:

- `edit`: a region of a file (whole definitions, 40-160 lines, at most 4,500 characters) and one
  edit of it (bench/corpus/edits.py: rename, add_parameter, add_docstrings, reorder,
  change_line); the reference is the whole edited region in a code block.
- `fim`: fill in the middle, cut as the shipped `fim` suite is (1-6 whole lines of a function
  body, up to 256 lines before and 64 after); every other one asks for a middle of at least
  120 characters (about 32 tokens) where the file has one.
- `copy`: a region and the request to quote one of its functions, methods or classes unchanged.

Beside the prompt keys each task has `language`, `source` ("PATH:FIRST-LAST", 1-based lines),
`kind` (the edit kind; the category for fim and copy) and `split`. Every task of a file is in the
same split; the split of each file is a seeded shuffle of the files of its language. The same
files and seed give the same tasks, byte for byte.

    tasks = build_corpus(default_sources(), seed=0, tasks=300)
    write_corpus("corpus", tasks, corpus_manifest(tasks, seed=0))
"""

from __future__ import annotations

import json
import random
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from draftwise.bench.corpus.code import (
    MAX_CUT,
    Limits,
    Shape,
    definitions,
    fim_parts,
    fim_spans,
    pick_regions,
    shape_of,
)
from draftwise.bench.corpus.edits import EDITS, MAX_ANSWER_CHARS, edit_kinds_for, limits_for
from draftwise.bench.corpus.sources import Source, provenance, read_source
from draftwise.errors import ConfigError

KINDS = ("edit", "fim", "copy")
DEFAULT_SHARES = {"edit": 0.5, "fim": 0.3, "copy": 0.2}
SPLITS = ("dev", "test")
FIRST_ID = 5001
LONG_MIDDLE = 120  # characters: about 32 tokens of code
COPY_LIMITS = Limits(min_lines=40, max_lines=240, max_chars=8_000)
DEFINITION_LINES = (4, 120)
LANGUAGE_TURNS = {"python": 2}  # files taken per round of the languages; 1 for the others
MAX_PASSES = 8  # rounds over a split's files, each giving a file at most one more task


@dataclass(frozen=True)
class File:
    """A source file as read for the corpus: its text and shape."""

    source: Source
    text: str
    shape: Shape

    @property
    def language(self) -> str:
        return self.source.language


def build_corpus(
    sources: Sequence[Source],
    *,
    seed: int = 0,
    tasks: int = 300,
    test_share: float = 0.5,
    kinds: Sequence[str] = KINDS,
    shares: Sequence[float] = (0.5, 0.3, 0.2),
) -> list[dict]:
    """The corpus's task dicts, dev first, with question ids from 5001.

    `tasks` is split round(tasks * test_share) for test and the rest for dev, and each split's
    count among `kinds` in proportion to `shares`. Fewer come back when the files run out.
    """
    check_arguments(sources, tasks, test_share, kinds, shares)
    files = split_files(sources, seed, test_share)
    num_test = int(tasks * test_share + 0.5)
    cache: dict[Path, File | None] = {}
    out = []
    for split, count in zip(SPLITS, (tasks - num_test, num_test)):
        quota = dict(zip(kinds, apportion(count, shares)))
        made = split_tasks(files[split], quota, seed, cache)
        out.extend(task | {"split": split} for task in made)
    return [{"question_id": FIRST_ID + i, **task} for i, task in enumerate(out)]


def check_arguments(
    sources: Sequence[Source], tasks: int, test_share: float, kinds: Sequence[str], shares: Sequence[float]
) -> None:
    """Raise ConfigError for arguments build_corpus cannot use."""
    if not sources:
        raise ConfigError("no source files found")
    if tasks < 1:
        raise ConfigError(f"tasks must be at least 1, got {tasks}")
    if not 0 <= test_share <= 1:
        raise ConfigError(f"test share must be between 0 and 1, got {test_share}")
    unknown = [k for k in kinds if k not in KINDS]
    if not kinds or unknown or len(set(kinds)) != len(kinds):
        raise ConfigError(f"kinds must be distinct names among {', '.join(KINDS)}, got {', '.join(kinds) or 'none'}")
    if len(shares) != len(kinds) or any(s <= 0 for s in shares):
        raise ConfigError(f"one positive share per kind is needed, got {list(shares)} for {list(kinds)}")


def apportion(total: int, shares: Sequence[float]) -> list[int]:
    """`total` split in proportion to `shares`, largest remainders first.

    Example: apportion(7, (0.5, 0.3, 0.2)) -> [4, 2, 1].
    """
    raw = [total * s / sum(shares) for s in shares]
    counts = [int(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (counts[i] - raw[i], i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def split_files(sources: Sequence[Source], seed: int, test_share: float) -> dict[str, list[Source]]:
    """Each language's files shuffled by the seed, the first round(n * test_share) to test and
    the rest to dev; each split's files then interleaved by language (interleave)."""
    rng = random.Random(seed)
    by_language: dict[str, list[Source]] = {}
    for source in sorted(sources, key=lambda s: s.path):
        by_language.setdefault(source.language, []).append(source)
    parts: dict[str, dict[str, list[Source]]] = {"dev": {}, "test": {}}
    for language, files in sorted(by_language.items()):
        rng.shuffle(files)
        num_test = int(len(files) * test_share + 0.5)
        parts["test"][language], parts["dev"][language] = files[:num_test], files[num_test:]
    return {split: interleave(groups) for split, groups in parts.items()}


def interleave(groups: dict[str, list[Source]]) -> list[Source]:
    """The languages take turns, Python two files a turn and the others one, so that a few
    languages with many files do not crowd out the rest."""
    queues = {language: deque(files) for language, files in sorted(groups.items())}
    order = []
    while any(queues.values()):
        for language, queue in queues.items():
            for _ in range(LANGUAGE_TURNS.get(language, 1)):
                if queue:
                    order.append(queue.popleft())
    return order


def load(source: Source, cache: dict[Path, File | None]) -> File | None:
    """The file, read once per build; None if it is not usable (read_source)."""
    if source.path not in cache:
        text = read_source(source)
        cache[source.path] = None if text is None else File(source, text, shape_of(text, source.language))
    return cache[source.path]


def split_tasks(files: list[Source], quota: dict[str, int], seed: int, cache: dict[Path, File | None]) -> list[dict]:
    """Tasks from one split's files: each pass gives each file at most one task, of the kind
    furthest behind its quota that the file can give; passes go on while they add tasks."""
    made: dict[str, list[dict]] = {kind: [] for kind in quota}
    seen: set[tuple[str, str]] = set()
    for number in range(MAX_PASSES):
        added = 0
        for source in files:
            wanted = sorted((k for k in quota if len(made[k]) < quota[k]), key=lambda k: len(made[k]) / quota[k])
            if not wanted:
                break
            file = load(source, cache)
            if file is None:
                continue
            for kind in wanted:
                rng = random.Random(f"{seed}/{source.rel}/{kind}/{number}")
                task = make_task(kind, file, rng, made[kind])
                if task is not None and (task["turns"][0], task["reference"]) not in seen:
                    seen.add((task["turns"][0], task["reference"]))
                    made[kind].append(task)
                    added += 1
                    break
        if not added:
            break
    return [task for kind in quota for task in made[kind]]


def make_task(kind: str, file: File, rng: random.Random, made: list[dict]) -> dict | None:
    """One task of `kind` from the file, or None if the file has none to give. `made`, the
    split's tasks of that kind so far, keeps edit kinds even and long fim middles at half."""
    if kind == "edit":
        return edit_task(file, rng, Counter(t["kind"] for t in made))
    if kind == "fim":
        return fim_task(file, rng, long_middle=len(made) % 2 == 0)
    return copy_task(file, rng)


def fenced(language: str, text: str) -> str:
    """A code block. Example: fenced("c", "int x;") -> "```c\\nint x;\\n```"."""
    return f"```{language}\n{text}\n```"


def source_of(file: File, first: int, last: int) -> str:
    """ "PATH:FIRST-LAST", 1-based lines, from 0-based first and last lines."""
    return f"{file.source.path}:{first + 1}-{last + 1}"


def edit_task(file: File, rng: random.Random, made: Counter | None = None) -> dict | None:
    """An edit of a kind drawn by `rng` among the language's, the kinds `made` least often
    first (the others are tried in turn where the file offers none of that kind)."""
    kinds = list(edit_kinds_for(file.language))
    rng.shuffle(kinds)
    kinds.sort(key=lambda k: (made or Counter())[k])
    for kind in kinds:
        for region in pick_regions(file.shape, limits_for(kind), rng, tries=4):
            edit = EDITS[kind](region, file.language, rng)
            if edit is None or edit.text == region.text or len(edit.text) > MAX_ANSWER_CHARS:
                continue
            prompt = (
                f"Here is `{file.source.rel}`:\n\n{fenced(file.language, region.text)}\n\n{edit.instruction} "
                "Reply with the whole updated file in one code block."
            )
            return {
                "category": "edit",
                "turns": [prompt],
                "reference": fenced(file.language, edit.text),
                "language": file.language,
                "source": source_of(file, region.first, region.last),
                "kind": edit.kind,
            }
    return None


def fim_task(file: File, rng: random.Random, long_middle: bool) -> dict | None:
    """A fill-in-the-middle cut as scripts/make_fim_suite.py makes them; with `long_middle`, one
    of at least LONG_MIDDLE characters where the file has one."""
    lines = file.shape.lines
    spans = fim_spans(file.text, file.language)
    if long_middle:
        spans = [(a, b) for a, b in spans if len("\n".join(lines[a : b + 1])) >= LONG_MIDDLE] or spans
    size = rng.randint(1, MAX_CUT)
    sized = [s for s in spans if s[1] - s[0] + 1 == size] or spans
    if not sized:
        return None
    first, last = rng.choice(sized)
    prefix, middle, suffix = fim_parts(lines, first, last)
    if not prefix.strip() or not middle.strip():
        return None
    return {
        "category": "fim",
        "turns": [prefix],
        "suffix": suffix,
        "reference": middle,
        "language": file.language,
        "source": source_of(file, first, last),
        "kind": "fim",
    }


def copy_task(file: File, rng: random.Random) -> dict | None:
    """A region and the request to quote one of its definitions unchanged."""
    low, high = DEFINITION_LINES
    for region in pick_regions(file.shape, COPY_LIMITS, rng, tries=4):
        found = [
            d
            for d in definitions(region, file.language)
            if low <= d.text.count("\n") + 1 <= high and len(d.text) <= MAX_ANSWER_CHARS and d.text != region.text
        ]
        if not found:
            continue
        chosen = rng.choice(found)
        if chosen.kind == "method":
            what = f"the method `{chosen.name}`" + (f" of the class `{chosen.owner}`" if chosen.owner else "")
        elif chosen.kind == "class":
            what = f"the class `{chosen.name}`" if file.language == "python" else f"the definition of `{chosen.name}`"
        else:
            what = f"the function `{chosen.name}`"
        prompt = (
            f"Here is `{file.source.rel}`:\n\n{fenced(file.language, region.text)}\n\n"
            f"Reply with {what} from it, unchanged, in one code block."
        )
        return {
            "category": "copy",
            "turns": [prompt],
            "reference": fenced(file.language, chosen.text),
            "language": file.language,
            "source": source_of(file, region.first, region.last),
            "kind": "copy",
        }
    return None


# ---- manifest and files ----------------------------------------------------------------------


def counted(values: list[str]) -> dict[str, int]:
    """Counts by value, sorted by value."""
    return dict(sorted(Counter(values).items()))


def corpus_manifest(tasks: list[dict], *, seed: int) -> dict:
    """What the corpus holds: the seed; per split the counts by category, edit kind and
    language; and the source files of each split with their package and licence."""
    counts, files = {}, {}
    for split in SPLITS:
        chosen = [t for t in tasks if t["split"] == split]
        counts[split] = {
            "tasks": len(chosen),
            "category": counted([t["category"] for t in chosen]),
            "edit_kind": counted([t["kind"] for t in chosen if t["category"] == "edit"]),
            "language": counted([t["language"] for t in chosen]),
        }
        per_file = Counter(t["source"].rsplit(":", 1)[0] for t in chosen)
        languages = {t["source"].rsplit(":", 1)[0]: t["language"] for t in chosen}
        files[split] = [source_entry(path, languages[path], n) for path, n in sorted(per_file.items())]
    return {"seed": seed, "first_question_id": FIRST_ID, "counts": counts, "sources": files}


def source_entry(path: str, language: str, num_tasks: int) -> dict:
    """One source file of the manifest."""
    package, licence = provenance(Path(path))
    return {"path": path, "language": language, "package": package, "licence": licence, "tasks": num_tasks}


def write_corpus(out: str | Path, tasks: list[dict], manifest: dict) -> list[Path]:
    """DIR/dev.jsonl, DIR/test.jsonl and DIR/manifest.json; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split in SPLITS:
        path = out / f"{split}.jsonl"
        lines = [json.dumps(t, ensure_ascii=False) + "\n" for t in tasks if t["split"] == split]
        path.write_text("".join(lines), encoding="utf-8")
        paths.append(path)
    path = out / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return [*paths, path]
