"""Fuzz of the stores' header reading: hypothesis-made GGUF files (every value type at every key
the facts read, counts and lengths at the 32/64-bit edges, NaN/Inf floats, split names, sparse
tails that let a lying length fit) through stores.inspect, and a few folders of them through
`draftwise models`: never an exception out of the store, never a hang, memory bounded.

Two kinds of file: a tiny real model with keys re-written (so the facts are reached), and
headers made from nothing. Sized to run in a few seconds."""

from __future__ import annotations

import json
import struct
import time
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner
from hostile_gguf import ARRAY, SCALARS, STRING, RawGGUF, build, parse, string
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftwise import stores
from draftwise.cli import main
from draftwise.server import catalog
from tiny_gguf import write_tiny_gguf

KEYS = (
    "general.architecture", "general.alignment", "general.name", "general.size_label", "general.file_type",
    "general.type", "llama.context_length", "llama.block_count", "llama.embedding_length",
    "llama.attention.head_count", "llama.attention.head_count_kv", "llama.attention.key_length",
    "llama.attention.value_length", "llama.vocab_size", "tokenizer.ggml.tokens", "tokenizer.ggml.model",
    "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.chat_template",
)  # fmt: skip
EDGES = (0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1)
NAMES = ("m.gguf", "m-00001-of-00000.gguf", "m-00001-of-00002.gguf", "m-00002-of-00002.gguf", "m-00000-of-00001.gguf",
         "mmproj-m.gguf")  # fmt: skip
TIME_LIMIT_S = 5  # per file: the bounded walks take well under a second
MEMORY_LIMIT = 256 * 2**20  # Python's allocations while reading one file (the reader keeps at most 128 MiB)
TINY: Path | None = None


@pytest.fixture(scope="module", autouse=True)
def _tiny_model(tmp_path_factory):
    """The tiny model the strategies re-write (drawn during the tests, after this ran)."""
    global TINY
    TINY = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", n_embd=16, n_head=2, n_head_kv=1)
    yield
    TINY = None


def _tiny() -> RawGGUF:
    return parse(TINY)


def _edge_int(fmt: str) -> st.SearchStrategy[int]:
    bits = struct.calcsize(fmt) * 8
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if fmt[1].islower() else (0, 2**bits - 1)
    return st.one_of(st.sampled_from([v for v in (*EDGES, low, -1) if low <= v <= high]), st.integers(low, high))


def _scalar(kind: int) -> st.SearchStrategy[bytes]:
    fmt = SCALARS[kind]
    if fmt in ("<f", "<d"):
        values = st.floats(allow_nan=True, allow_infinity=True, width=32 if fmt == "<f" else 64)
    elif fmt == "<?":
        values = st.booleans()
    else:
        values = _edge_int(fmt)
    return values.map(lambda v: struct.pack(fmt, v))


TEXT = st.one_of(st.sampled_from(["llama", "qwen2", "<|im_end|>", "{{ x }}", ""]), st.text(max_size=8))
LENGTHS = st.one_of(st.none(), st.sampled_from(EDGES), st.integers(0, 64))  # None: the true length


@st.composite
def _string(draw) -> bytes:
    raw = draw(TEXT).encode("utf-8", "surrogatepass")
    return string(raw, draw(LENGTHS))


@st.composite
def _value(draw, kind: int) -> bytes:
    if kind in SCALARS:
        return draw(_scalar(kind))
    if kind == STRING:
        return draw(_string())
    if kind != ARRAY:
        return draw(st.binary(max_size=8))  # an unknown type: whatever follows
    item = draw(st.sampled_from([*SCALARS, STRING, STRING, STRING, ARRAY, 13, 2**32 - 1]))  # mostly known types
    items = draw(st.lists(_value(item) if item in SCALARS or item == STRING else st.binary(max_size=4), max_size=6))
    count = draw(st.one_of(st.just(len(items)), st.sampled_from(EDGES)))
    return struct.pack("<IQ", item, count) + b"".join(items)


@st.composite
def _kv(draw) -> tuple[str, int, bytes]:
    key = draw(st.sampled_from(KEYS)) if draw(st.integers(0, 4)) else draw(st.text(max_size=12))
    kind = draw(st.sampled_from([*SCALARS, *[STRING, ARRAY] * 4] * 2 + [13, 2**32 - 1]))  # an unknown one rarely
    return key, kind, draw(_value(kind))


@st.composite
def _tensor(draw) -> bytes:
    n_dims = draw(st.integers(0, 9))
    dims = draw(st.lists(st.one_of(st.sampled_from(EDGES), st.integers(0, 64)), min_size=n_dims, max_size=n_dims))
    kind = draw(st.one_of(st.integers(0, 40), st.just(2**32 - 1)))
    offset = draw(st.one_of(st.sampled_from(EDGES), st.integers(0, 4096)))
    return draw(_string()) + struct.pack(f"<I{n_dims}QIQ", n_dims, *dims, kind, offset)


@st.composite
def gguf_files(draw) -> tuple[str, bytes, int]:
    """(file name, bytes, the file's size: more than the bytes where its tail is sparse)."""
    if draw(st.booleans()):  # the tiny model, keys re-written
        raw = _tiny()
        for key, kind, value in draw(st.lists(_kv(), min_size=1, max_size=4)):
            raw = RawGGUF(raw.version, tuple(k for k in raw.kvs if k[0] != key) + ((key, kind, value),),
                          raw.tensor_infos, raw.num_tensors, raw.data)  # fmt: skip
        data = build(raw)
    else:
        kvs = draw(st.lists(_kv(), max_size=5))
        tensors = draw(st.lists(_tensor(), max_size=3))
        version = draw(st.sampled_from([3, 3, 2, 1, 2**32 - 1]))
        counts = draw(st.tuples(st.one_of(st.just(len(tensors)), st.sampled_from(EDGES)),
                                st.one_of(st.just(len(kvs)), st.sampled_from(EDGES))))  # fmt: skip
        body = b"".join(string(k) + struct.pack("<I", kind) + v for k, kind, v in kvs) + b"".join(tensors)
        data = b"GGUF" + struct.pack("<IQQ", version, *counts) + body
        data = data[: draw(st.integers(0, len(data)))] if draw(st.integers(0, 9)) == 0 else data  # cut short
    size = draw(st.sampled_from([len(data), len(data), len(data) + 4096, 2**30, 2**40]))
    name = draw(st.sampled_from(NAMES)) if draw(st.integers(0, 5)) == 0 else "m.gguf"  # a split name at times
    return name, data, size


def _write(folder: Path, name: str, data: bytes, size: int) -> Path:
    path = folder / name
    with open(path, "wb") as f:
        f.write(data)
        f.truncate(max(size, len(data)))  # sparse: a tail of zeros, no disk
    return path


def _clean(folder: Path) -> None:
    for p in folder.iterdir():
        p.unlink()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gguf_files())
def test_no_header_raises_hangs_or_balloons_out_of_the_store(tmp_path, case):
    from hostile_gguf import within

    name, data, size = case
    folder = tmp_path / "store"
    folder.mkdir(exist_ok=True)
    _clean(folder)
    path = _write(folder, name, data, size)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with within(4 * TIME_LIMIT_S):  # a hang fails here instead of stopping the suite
            item = stores.inspect(name, "folder", path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < TIME_LIMIT_S and peak < MEMORY_LIMIT
    assert item is None or isinstance(item, (stores.FoundModel, stores.Skipped))
    if isinstance(item, stores.FoundModel):
        assert (item.facts is None) != (item.problem is None)
        assert item.problem is None or stores.UNFORESEEN not in item.problem, item.problem
        if item.facts is not None:
            json.dumps(item.as_json())  # what `draftwise models --json` prints
            assert 0 <= item.facts.kv_bytes_per_token <= item.facts.size_bytes


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(gguf_files(), min_size=3, max_size=6))
def test_models_and_serve_list_a_folder_of_fuzzed_files(tmp_path, monkeypatch, cases):
    """`draftwise models --json` on a folder of them beside a model, and the catalog `serve
    --models DIR` serves from: both list the model, nothing raises."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / ".cache"))
    for variable in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "LLAMA_CACHE"):
        monkeypatch.delenv(variable, raising=False)
    folder = tmp_path / "store"
    folder.mkdir(exist_ok=True)
    _clean(folder)
    (folder / "good.gguf").write_bytes(build(_tiny()))
    for i, (name, data, size) in enumerate(cases):
        _write(folder, f"{i}-{name}", data, size)
    result = CliRunner().invoke(main, ["models", "--json", "--models-dir", str(folder)])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)["models"]}
    assert rows["good.gguf"]["architecture"] == "llama"
    assert not any(stores.UNFORESEEN in row.get("problem", "") for row in rows.values())
    table = CliRunner().invoke(main, ["models", "--models-dir", str(folder)])
    assert table.exit_code == 0, table.output
    served = catalog.chosen(str(folder), str(folder / "good.gguf"))
    sources = catalog.sources(served, None, n_ctx=256, num_slots=1)
    assert served[0].facts is not None and all(s.memory_bytes >= 0 for s in sources)


@pytest.fixture(autouse=True)
def _no_leftover_alarm():
    yield
    import signal

    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
