"""Draft pairing (`--draft auto`): among the models the user has (draftwise.stores), the draft
model the auto policy would gain most from with this target on this host, or none.

Candidates are the GGUF models smaller than the target that fit in the memory left. Those of the
target's own vocabulary (the GGUF headers' token lists equal: read, not loaded) come first; one
of another vocabulary only where none of those can pay, and only where it shares enough of its
tokens' texts to draft across vocabularies (drafters/crossvocab.py). Each is priced as the auto
policy prices a draft model (policy.auto.draft_speedup at DRAFT_MODEL_PRIOR acceptance): from
the calibrated costs, the draft's own cached curve where it was measured on this host, else the
target's scaled by the draft's share of the target's weights (a one-token forward on a CPU reads
every weight once). The best that beats MIN_GAIN is the draft; the note says which and why.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from draftwise import calibrate, stores
from draftwise.calibrate import CostCurve
from draftwise.drafters.crossvocab import MIN_SHARED
from draftwise.errors import ModelError
from draftwise.gguf_header import TOKENS_KEY, read_header
from draftwise.model_facts import ModelFacts, available_memory, memory_needed
from draftwise.policy.auto import DRAFT_MODEL_PRIOR, MIN_GAIN, draft_speedup

AUTO = "auto"  # the name in a --draft list that pairing fills
MAX_DRAFTS_LISTED = 3  # drafts `draftwise models` names per model
MAX_CROSS_CHECKS = 8  # other vocabularies judged per model there (each vocabulary pair judged once)


@dataclass(frozen=True)
class Candidate:
    """A model priced as a draft: its store name and file, whether it shares the target's
    vocabulary, its share of the target's size, and the speedup (and k) at the prior acceptance."""

    name: str
    path: Path
    same_vocabulary: bool
    size_ratio: float
    speedup: float
    k: int
    calibrated: bool  # its own cached cost curve (else scaled from the target's by size)

    def why(self) -> str:
        """Example: 'same vocabulary, 44% of the target's size; at 0.70 acceptance 1.31x on this host'."""
        vocabulary = "same vocabulary" if self.same_vocabulary else "another vocabulary, drafted across"
        cost = "calibrated" if self.calibrated else "its cost estimated from its size"
        return (
            f"{vocabulary}, {self.size_ratio:.0%} of the target's size; at {DRAFT_MODEL_PRIOR:.2f} acceptance "
            f"{self.speedup:.2f}x on this host, {cost}"
        )


@dataclass(frozen=True)
class Pairing:
    """The draft picked (None: none can pay) and the one line that says which and why."""

    draft: Candidate | None
    note: str
    priced: tuple[Candidate, ...] = ()  # every candidate priced, best first


def token_texts(tokens: Sequence[str], model: str) -> set[str]:
    """A GGUF token list's texts as text, comparable across tokenizer kinds: gpt2's byte-level
    pieces decoded ("Ġthe" -> " the"), SentencePiece's word marks as spaces ("▁the" -> " the").
    A piece that is not whole UTF-8 (part of a character) is left out."""
    out = set()
    tokens = [t for t in tokens if isinstance(t, str)]  # a hostile list's other items are no texts
    if model == "gpt2":
        byte_of = _gpt2_bytes()
        for token in tokens:
            try:
                out.add(bytes(byte_of[c] for c in token).decode("utf-8"))
            except KeyError:  # a character outside the byte alphabet: a control token's own text
                out.add(token)
            except UnicodeDecodeError:
                continue
        return out
    return {t.replace("\u2581", " ") for t in tokens if not (t.startswith("<0x") and t.endswith(">"))}


@functools.cache
def _gpt2_bytes() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character each byte is written as -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def _vocabulary(path: Path) -> tuple[list[str], str, str | None]:
    """A file's token texts, tokenizer kind and vocabulary id (GGUFHeader.vocabulary_id)."""
    header = read_header(path)
    tokens, kind = header.metadata.get(TOKENS_KEY), header.metadata.get("tokenizer.ggml.model")
    tokens = tokens if isinstance(tokens, list) and all(isinstance(t, str) for t in tokens) else []
    return tokens, (kind if isinstance(kind, str) else ""), header.vocabulary_id if tokens else None


class _Vocabularies:
    """Which models share a vocabulary, with each file's token list read at most once: the ids
    come from the facts stores.inspect read (a header is read again only for a file listed
    without them), and the texts of a vocabulary are read, once, only to judge a
    cross-vocabulary draft."""

    def __init__(self) -> None:
        self._ids: dict[Path, str | None] = {}
        self._texts: dict[str, tuple[set[str], int]] = {}  # vocabulary id -> (token texts, number of tokens)
        self._shares: dict[tuple[str, str], bool] = {}

    def _read(self, path: Path) -> tuple[list[str], str, str | None]:
        try:
            return _vocabulary(path)
        except (ModelError, OSError):
            return [], "", None

    def id_of(self, path: Path, facts: ModelFacts | None) -> str | None:
        if facts is not None and facts.vocabulary_id is not None:
            return facts.vocabulary_id
        if path not in self._ids:
            tokens, kind, self._ids[path] = self._read(path)
            if self._ids[path] is not None:
                self._texts.setdefault(self._ids[path], (token_texts(tokens, kind), len(tokens)))
        return self._ids[path]

    def shares(self, draft_id: str, draft_path: Path, target_id: str, target_path: Path) -> bool:
        """Whether the draft's vocabulary shares at least MIN_SHARED of its tokens' texts with the target's."""
        key = (draft_id, target_id)
        if key not in self._shares:
            draft_texts, num_draft = self._texts_of(draft_id, draft_path)
            target_texts, _ = self._texts_of(target_id, target_path)
            self._shares[key] = num_draft > 0 and len(draft_texts & target_texts) >= MIN_SHARED * num_draft
        return self._shares[key]

    def _texts_of(self, vocab_id: str, path: Path) -> tuple[set[str], int]:
        if vocab_id not in self._texts:
            tokens, kind, _ = self._read(path)
            self._texts[vocab_id] = (token_texts(tokens, kind), len(tokens))
        return self._texts[vocab_id]


def pair_draft(
    target_path: Path,
    target_curve: CostCurve,
    *,
    threads: int,
    n_ctx: int,
    num_slots: int = 1,
    discovery: stores.Discovery | None = None,
    available: int | None = None,
) -> Pairing:
    """The draft for the target at target_path among the discovered models (stores.discover()
    when None), priced against the target's calibrated curve; threads and n_ctx are the draft's
    as it would be loaded (they key its cached curve)."""
    discovery = discovery or stores.discover()
    target_path = Path(target_path)
    target = next((m for m in discovery.models if _same_file(m.path, target_path)), None)
    target_size = target.facts.size_bytes if target and target.facts else target_path.stat().st_size
    available = available_memory() if available is None else available
    smaller = [
        m
        for m in discovery.models
        if m.facts is not None
        and m.facts.size_bytes < target_size
        and not _same_file(m.path, target_path)
        and (available is None or memory_needed(m.facts, n_ctx, num_slots) <= available)
    ]
    if not smaller:
        return Pairing(
            None,
            "not loaded: none of your models is smaller than the target and fits in the memory left "
            "(`draftwise models` lists them)",
        )
    vocabularies = _Vocabularies()
    target_id = vocabularies.id_of(target_path, target.facts if target else None)
    priced: list[Candidate] = []
    for same in (True, False):
        for model in smaller:
            model_id = vocabularies.id_of(model.path, model.facts)
            if target_id is None or model_id is None or (model_id == target_id) != same:
                continue
            if not same and not vocabularies.shares(model_id, model.path, target_id, target_path):
                continue
            priced.append(_price(model, same, target_size, target_curve, threads, n_ctx))
        paying = [c for c in priced if c.same_vocabulary == same and c.speedup > MIN_GAIN]
        if paying:
            best = max(paying, key=lambda c: c.speedup)
            return Pairing(best, f"draft: {best.name} ({best.why()})", _ranked(priced))
    if not priced:
        return Pairing(
            None, f"not loaded: none of your {len(smaller)} smaller models shares enough of the target's vocabulary"
        )
    best = _ranked(priced)[0]
    return Pairing(
        None,
        f"not loaded: no model of yours would pay as a draft on this host: the best, {best.name} ({best.why()}), "
        f"is below the {MIN_GAIN:.2f}x the auto policy needs",
        _ranked(priced),
    )


def _price(
    model: stores.FoundModel, same: bool, target_size: int, target_curve: CostCurve, threads: int, n_ctx: int
) -> Candidate:
    stat = model.path.stat()
    identity = f"{model.path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"  # as the llama.cpp backend's
    curve = calibrate.cached_curve(identity, threads, n_ctx)
    ratio = model.facts.size_bytes / target_size
    if curve is None:
        curve = CostCurve(((1, target_curve.ms(1) * ratio),), source="estimated")
    speedup, k = draft_speedup(target_curve, curve, DRAFT_MODEL_PRIOR)
    return Candidate(model.name, model.path, same, ratio, speedup, k, curve.source != "estimated")


def _ranked(priced: Sequence[Candidate]) -> tuple[Candidate, ...]:
    return tuple(sorted(priced, key=lambda c: (not c.same_vocabulary, -c.speedup)))


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or a.samefile(b)
    except OSError:
        return False


@dataclass(frozen=True)
class Compatible:
    """A model that could draft for another: smaller, of its vocabulary or sharing enough of it."""

    name: str
    same_vocabulary: bool


def compatible_drafts(
    found: Sequence[stores.FoundModel], limit: int = MAX_DRAFTS_LISTED
) -> dict[str, list[Compatible]]:
    """For each usable model, the few best of the others that could draft for it (what `draftwise
    models` lists): smaller, with the same GGUF token list, else sharing at least MIN_SHARED of
    their token texts (cross-vocabulary drafting); the same vocabulary first, then the smallest
    (the cheapest, as pair_draft prices them), at most limit. Each header's tokens are read at
    most once, and at most MAX_CROSS_CHECKS other vocabularies are judged per model, so a folder
    of a thousand models lists in seconds."""
    usable = sorted((m for m in found if m.facts is not None), key=lambda m: m.facts.size_bytes)
    vocabularies = _Vocabularies()
    by_vocabulary: dict[str, list[stores.FoundModel]] = {}  # each list smallest first
    ids = {}
    for m in usable:
        ids[m.path] = vocabularies.id_of(m.path, m.facts)
        if ids[m.path] is not None:
            by_vocabulary.setdefault(ids[m.path], []).append(m)
    out: dict[str, list[Compatible]] = {}
    for target in usable:
        target_id, size = ids[target.path], target.facts.size_bytes
        if target_id is None:
            out[target.name] = []
            continue
        drafts = [Compatible(m.name, True) for m in _smaller(by_vocabulary[target_id], size)[:limit]]
        cross: list[stores.FoundModel] = []
        others = [v for v in by_vocabulary if v != target_id and by_vocabulary[v][0].facts.size_bytes < size]
        for other in others[:MAX_CROSS_CHECKS] if len(drafts) < limit else ():
            if vocabularies.shares(other, by_vocabulary[other][0].path, target_id, target.path):
                cross += _smaller(by_vocabulary[other], size)[:limit]
        cross.sort(key=lambda m: m.facts.size_bytes)
        out[target.name] = drafts + [Compatible(m.name, False) for m in cross[: limit - len(drafts)]]
    return out


def _smaller(models: Sequence[stores.FoundModel], size: int) -> list[stores.FoundModel]:
    """Those of models (smallest first) smaller than size."""
    return [m for m in models if m.facts.size_bytes < size]
