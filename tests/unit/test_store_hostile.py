"""Hostile files in a store (draftwise.stores, gguf_header, model_facts, pairing, server.catalog):
each is listed under "cannot use" with its reason, or skipped with one, and never stops the
listing of the others, `draftwise models` or `serve --models DIR`; only regular files are opened
(a FIFO never hangs a listing); a header's lies cost neither memory nor time nor a sane memory
estimate; the drafts column names a few drafts per model, each header's tokens read once.
Every hostile file is made here, in a temporary folder."""

from __future__ import annotations

import json
import math
import os
import struct
import time
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner
from hostile_gguf import ARRAY, STRING, build, parse, string, within, write

from draftwise import gguf_header, model_facts, pairing, stores
from draftwise.cli import main
from draftwise.errors import ModelError
from draftwise.gguf_header import GGUFError, NotRegularFile, read_header
from draftwise.server import catalog
from tiny_gguf import write_tiny_gguf

F32, F64, I64, U32, I32 = 6, 12, 11, 4, 5
STORE_VARIABLES = ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "LLAMA_CACHE")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny model whose header the tests re-write with one key changed."""
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "good.gguf", n_embd=16, n_head=2, n_head_kv=1)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty home (no store), so that only the --models-dir folder of a test is listed."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / ".cache"))
    for name in STORE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    folder = tmp_path / "models"
    folder.mkdir()
    return folder


def _listing(folder: Path) -> tuple[dict[str, stores.FoundModel], dict[str, str]]:
    discovery = stores.discover(stores.StoreRoots((("folder", folder),)))
    return {m.name: m for m in discovery.models}, {s.path.name: s.reason for s in discovery.skipped}


def _models_json(folder: Path) -> dict:
    result = CliRunner().invoke(main, ["models", "--json", "--models-dir", str(folder)])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


# ---------------------------------------------------------------------- item 1: wrong types
COUNT_LIES = [
    pytest.param("llama.context_length", F32, math.nan, id="context-f32-nan"),
    pytest.param("llama.context_length", F64, math.inf, id="context-f64-inf"),
    pytest.param("llama.block_count", I64, -(2**62), id="layers-negative"),
    pytest.param("llama.attention.head_count", STRING, "many", id="heads-string"),
    pytest.param("llama.embedding_length", ARRAY, (F32, [math.nan, 1.0]), id="width-float-array"),
]


@pytest.mark.parametrize("key, kind, value", COUNT_LIES)
def test_a_count_that_is_no_integer_is_a_problem_and_the_others_are_listed(home, tiny, key, kind, value):
    (home / "good.gguf").write_bytes(tiny.read_bytes())
    write(home / "bad.gguf", parse(tiny).with_kv(key, kind, value))
    found, _ = _listing(home)
    assert found["good.gguf"].facts is not None and found["good.gguf"].problem is None
    assert found["bad.gguf"].facts is None and key in found["bad.gguf"].problem
    assert "bad.gguf: cannot be used" in found["bad.gguf"].problem
    rows = {row["name"]: row for row in _models_json(home)["models"]}
    assert "problem" in rows["bad.gguf"] and rows["good.gguf"]["architecture"] == "llama"
    with pytest.raises(ModelError, match="bad.gguf"):  # loading it is an error naming it, too
        stores.check_loadable(home / "bad.gguf", 256)


def test_a_token_list_of_integers_is_a_problem_and_models_still_lists(home, tiny):
    (home / "good.gguf").write_bytes(tiny.read_bytes())
    write(home / "ints.gguf", parse(tiny).with_kv("tokenizer.ggml.tokens", ARRAY, (U32, list(range(300)))))
    write(home / "few-ints.gguf", parse(tiny).with_kv("tokenizer.ggml.tokens", ARRAY, (I32, [1, 2])))
    found, _ = _listing(home)
    assert "not of strings" in found["ints.gguf"].problem and "not of strings" in found["few-ints.gguf"].problem
    with pytest.raises(GGUFError, match="few-ints.gguf: cannot be used .* not a list of strings"):
        stores.check_loadable(home / "few-ints.gguf", 256)  # read without the texts: the facts refuse it
    table = CliRunner().invoke(main, ["models", "--models-dir", str(home)])
    assert table.exit_code == 0, table.output
    assert "cannot use ints.gguf" in table.output and "cannot use few-ints.gguf" in table.output
    assert pairing.token_texts([1, "a", None], "gpt2") == {"a"}  # the library, handed one anyway


@pytest.mark.parametrize("name", ["X-00001-of-00000.gguf", "X-00000-of-00002.gguf", "X-00003-of-00002.gguf"])
def test_a_split_name_that_counts_wrong_is_a_problem(home, tiny, name):
    (home / name).write_bytes(tiny.read_bytes())
    found, _ = _listing(home)
    assert "split model: its name says part" in found[name].problem
    with pytest.raises(ModelError, match="split model"):
        stores.check_loadable(home / name, 256)


def test_many_missing_parts_are_named_briefly(home, tiny):
    (home / "big-00001-of-99999.gguf").write_bytes(tiny.read_bytes())
    problem = _listing(home)[0]["big-00001-of-99999.gguf"].problem
    assert "and 99,995 more" in problem and len(problem) < 400


# ---------------------------------------------------------------------- item 2: no regular file
def test_a_fifo_a_folder_and_a_device_named_gguf_are_skipped_unopened(home, tiny, monkeypatch):
    (home / "good.gguf").write_bytes(tiny.read_bytes())
    os.mkfifo(home / "pipe.gguf")
    (home / "folder.gguf").mkdir()
    (home / "null.gguf").symlink_to("/dev/null")
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(Path(path).name) or real_open(path, *a, **k))
    with within(10):  # the pipe has no writer: opening it to read would block for ever
        found, skipped = _listing(home)
        rows = _models_json(home)
    assert skipped == {
        "pipe.gguf": "a named pipe (FIFO), not a model file",
        "folder.gguf": "a directory, not a model file",
        "null.gguf": "a character device, not a model file",
    }
    assert set(opened) <= {"good.gguf"} and found["good.gguf"].facts is not None
    assert {s["path"].rsplit("/", 1)[-1] for s in rows["skipped"]} == set(skipped)
    with pytest.raises(NotRegularFile, match="pipe.gguf: a named pipe"), within(10):
        read_header(home / "pipe.gguf")
    names = stores.discover(stores.StoreRoots((("folder", home),)), with_facts=False).models
    assert [m.name for m in names] == ["good.gguf"]  # what resolving a name lists: regular files only


# ---------------------------------------------------------------------- item 9: estimates
def test_memory_estimates_are_never_negative_and_capped_by_the_file(home, tiny):
    raw = parse(tiny)
    huge = raw.with_kv("llama.attention.head_count_kv", U32, 2**32 - 1).with_kv("llama.block_count", U32, 2**32 - 1)
    write(home / "huge.gguf", huge.with_kv("llama.embedding_length", U32, 2**32 - 1))
    facts = model_facts.facts_of([read_header(home / "huge.gguf")])
    assert facts.kv_bytes_per_token == facts.size_bytes  # capped: the cache per token within the file
    needed = model_facts.memory_needed(facts, 4096)
    assert needed == facts.size_bytes * 4097 + model_facts.OVERHEAD_BYTES
    with pytest.raises(ModelError) as caught:
        model_facts.check_memory(home / "huge.gguf", facts, 4096, available=2**20)
    gib = [float(x.replace(",", "")) for x in caught.value.args[0].split() if x[:1].isdigit() and "." in x]
    assert gib and max(gib) < 10  # "needs about 0.6 GiB", never 1e33 GiB
    negative = model_facts.ModelFacts(**{**facts.__dict__, "kv_bytes_per_token": -(2**62)})
    assert model_facts.memory_needed(negative, 4096) == facts.size_bytes + model_facts.OVERHEAD_BYTES
    (source,) = catalog.sources(catalog.chosen(str(home), str(home / "huge.gguf")), None, n_ctx=4096, num_slots=1)
    assert 0 < source.memory_bytes == needed


# ---------------------------------------------------------------------- item 10: bounded reads
def _sparse(path: Path, head: bytes, size: int) -> Path:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def test_a_600_mb_key_is_refused_unread(tmp_path):
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 600 * 2**20)
    path = _sparse(tmp_path / "key.gguf", head, 700 * 2**20)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(GGUFError, match="a key of 629,145,600 bytes"):
            read_header(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 1 and peak < 2**20


def test_a_600_mb_value_string_is_read_past_and_a_huge_token_list_refused(tmp_path):
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + string("general.license") + struct.pack("<I", STRING)
    path = _sparse(tmp_path / "value.gguf", head + struct.pack("<Q", 600 * 2**20), 700 * 2**20)
    with open(path, "r+b") as f:  # a second key after the long value, where the reader must find it
        f.seek(len(head) + 8 + 600 * 2**20)
        f.write(string("general.name") + struct.pack("<I", STRING) + string("after"))
    tracemalloc.start()
    try:
        header = read_header(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert header.metadata["general.license"] == gguf_header.SkippedString(600 * 2**20)
    assert header.metadata["general.name"] == "after" and peak < 2**20
    count = gguf_header.MAX_TOKENS + 1  # each an empty string: 8 bytes of zeros, then keys of zeros
    body = (
        b"GGUF"
        + struct.pack("<IQQ", 3, 0, 3)
        + string("tokenizer.ggml.tokens")
        + struct.pack("<IIQ", ARRAY, STRING, count)
    )
    path = _sparse(tmp_path / "tokens.gguf", body, len(body) + 9 * count)
    with pytest.raises(GGUFError, match=f"{count:,} tokens"):
        read_header(path)
    assert read_header(path, with_tokens=False).metadata["tokenizer.ggml.tokens"].length == count


def test_lying_counts_are_refused_without_walking_them(tmp_path):
    for num_tensors, num_kv in ((2**64 - 1, 0), (0, 2**63), (gguf_header.MAX_TENSORS + 1, 0)):
        head = b"GGUF" + struct.pack("<IQQ", 3, num_tensors, num_kv)
        path = _sparse(tmp_path / "counts.gguf", head, 2**40)
        with pytest.raises(GGUFError, match="corrupt GGUF file"), within(5):
            read_header(path)
    strings = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + string("merges") + struct.pack("<IIQ", ARRAY, STRING, 2**38)
    with pytest.raises(GGUFError, match="strings in its arrays"), within(5):
        read_header(_sparse(tmp_path / "strings.gguf", strings, 2**42))


def test_tensor_shapes_that_lie_are_refused(home, tiny):
    raw = parse(tiny)
    name = b"token_embd.weight"
    infos = raw.tensor_infos
    at = infos.index(name) + len(name) + 4  # past the name and its number of dimensions (2)
    lying = infos[:at] + struct.pack("<QQ", 2**63, 2**63) + struct.pack("<I", 99) + infos[at + 20 :]  # type unknown
    write(home / "shape.gguf", type(raw)(raw.version, raw.kvs, lying, raw.num_tensors, raw.data))
    with pytest.raises(GGUFError, match="more weights than"):
        read_header(home / "shape.gguf")


# ---------------------------------------------------------------------- item 11: no tensors, drafts, many files
def test_a_header_without_tensors_is_no_model_and_no_draft(home, tiny):
    raw = parse(tiny)
    write(home / "zz-big.gguf", raw)
    write(home / "header-only.gguf", type(raw)(raw.version, raw.kvs, b"", 0, b""))
    (home / "vocab-only.gguf").write_bytes(build(type(raw)(raw.version, raw.kvs, b"", 0, b""), pad=False))
    found, _ = _listing(home)
    assert "without tensors" in found["header-only.gguf"].problem
    assert "without tensors" in found["vocab-only.gguf"].problem  # not "truncated": no data to need
    rows = {row["name"]: row for row in _models_json(home)["models"]}
    assert rows["zz-big.gguf"]["drafts"] == [] and "problem" in rows["header-only.gguf"]


def test_the_drafts_column_names_a_few_and_each_header_is_read_once(home, tiny, monkeypatch):
    """A folder of 60 models of one vocabulary, 20 smaller ones of another and 300 other files:
    each model lists the three smallest drafts, its own vocabulary first; the listing reads every
    header once, and pairing reads one file of each vocabulary it judges across."""
    data = tiny.read_bytes()
    other = write_tiny_gguf(home.parent / "other.gguf", n_embd=16, n_head=2, n_head_kv=1, special_tokens=("<x>",))
    for i in range(60):
        (home / f"same-{i:02d}.gguf").write_bytes(data + b"\0" * (4096 + 64 * i))  # sizes apart, tensors alike
    for i in range(20):
        (home / f"other-{i:02d}.gguf").write_bytes(other.read_bytes() + b"\0" * (64 * i))
    for i in range(300):
        (home / f"notes-{i:03d}.txt").write_text("no model")
    reads: dict[str, list[str]] = {"stores": [], "pairing": []}
    real = gguf_header.read_header
    for module in (stores, pairing):
        log = reads[module.__name__.rsplit(".", 1)[-1]]
        monkeypatch.setattr(
            module, "read_header", lambda path, log=log, **k: log.append(Path(path).name) or real(path, **k)
        )
    started = time.perf_counter()
    data = _models_json(home)
    elapsed = time.perf_counter() - started
    rows = {row["name"]: row for row in data["models"] if row.get("store") == "folder"}
    assert len(rows) == 80 and sorted(reads["stores"]) == sorted(rows)  # one read a file
    assert len(reads["pairing"]) <= 2  # the texts of each vocabulary, judged across once
    names = {name: [(d["name"], d["same_vocabulary"]) for d in row["drafts"]] for name, row in rows.items()}
    assert names["same-59.gguf"] == [("same-00.gguf", True), ("same-01.gguf", True), ("same-02.gguf", True)]
    assert names["same-01.gguf"] == [("same-00.gguf", True), ("other-00.gguf", False), ("other-01.gguf", False)]
    assert names["other-19.gguf"] == [("other-00.gguf", True), ("other-01.gguf", True), ("other-02.gguf", True)]
    assert names["other-00.gguf"] == []  # the smallest: nothing smaller
    assert elapsed < 30  # seconds on a shared 2-core host; ~2 s alone
    same = read_header(home / "same-00.gguf")
    assert read_header(home / "same-00.gguf", with_tokens=False).vocabulary_id == same.vocabulary_id
    assert same.vocabulary_id != read_header(home / "other-00.gguf").vocabulary_id


# ---------------------------------------------------------------------- item 12: Ollama digests
@pytest.mark.parametrize("digest", ["/etc/passwd", "sha256:../../../etc/passwd", "sha256:" + "g" * 64, 7])
def test_an_ollama_digest_that_is_no_sha256_names_no_blob(home, tiny, digest, monkeypatch):
    root = home.parent / "ollama"
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / "evil" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": stores.OLLAMA_MODEL_LAYER, "digest": digest}]}))
    (root / "blobs").mkdir()
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(str(path)) or real_open(path, *a, **k))
    (model,) = stores.discover(stores.StoreRoots((("ollama", root),))).models
    assert model.name == "evil:latest" and "not a sha256 digest" in model.problem
    assert opened == [str(manifest)] and model.path == manifest


def test_a_deep_or_huge_manifest_is_a_problem(home):
    root = home.parent / "ollama"
    manifests = root / "manifests" / "registry.ollama.ai" / "library"
    (manifests / "deep").mkdir(parents=True)
    (manifests / "deep" / "latest").write_text("[" * 100_000)
    (manifests / "huge").mkdir()
    with open(manifests / "huge" / "latest", "wb") as f:
        f.truncate(2**30)  # sparse: never read
    found = {m.name: m.problem for m in stores.discover(stores.StoreRoots((("ollama", root),))).models}
    assert "names no model layer" in found["deep:latest"] and "over 1 MiB" in found["huge:latest"]


# ---------------------------------------------------------------------- serve --models DIR
def test_serve_models_dir_starts_with_hostile_files_beside_a_model(home, tiny):
    """The catalog of `serve --models DIR` of every hostile kind above: the good model is served,
    each bad one is a model whose load fails with its problem (the server starts)."""
    (home / "good.gguf").write_bytes(tiny.read_bytes())
    raw = parse(tiny)
    write(home / "nan.gguf", raw.with_kv("llama.context_length", F32, math.nan))
    write(home / "ints.gguf", raw.with_kv("tokenizer.ggml.tokens", ARRAY, (U32, [1, 2, 3])))
    write(home / "empty.gguf", type(raw)(raw.version, raw.kvs, b"", 0, b""))
    (home / "X-00001-of-00000.gguf").write_bytes(tiny.read_bytes())
    os.mkfifo(home / "pipe.gguf")
    with within(10):
        served = {s.name: s for s in catalog.chosen(str(home), str(home / "good.gguf"))}
        sources = {s.name: s for s in catalog.sources(list(served.values()), None, n_ctx=256, num_slots=1)}
    assert served["good.gguf"].facts is not None and served["good.gguf"].problem is None
    assert set(served) == {"good.gguf", "nan.gguf", "ints.gguf", "empty.gguf", "X-00001-of-00000.gguf"}
    for name in set(served) - {"good.gguf"}:
        assert served[name].problem and name in served[name].problem
        with pytest.raises(ModelError, match=name.replace(".", r"\.")):
            sources[name].load()
    with within(10):  # a bad file named as the default model: served, failing by name
        (bad,) = catalog.chosen(str(home / "nan.gguf"), str(home / "nan.gguf"))
    assert "llama.context_length" in bad.problem


def test_serve_models_dir_answers_beside_hostile_files(home, tiny):
    """`draftwise serve --models DIR` itself (a subprocess) with a FIFO and bad files beside a
    model: it starts, serves the model, and a bad one's request fails naming its file."""
    pytest.importorskip("llama_cpp")
    import httpx

    from tests.server.test_cli_serve import serving

    (home / "good.gguf").write_bytes(tiny.read_bytes())
    write(home / "nan.gguf", parse(tiny).with_kv("llama.context_length", F32, math.nan))
    (home / "X-00001-of-00000.gguf").write_bytes(tiny.read_bytes())
    os.mkfifo(home / "pipe.gguf")
    args = ["--target", str(home / "good.gguf"), "--models", str(home), "--draft", "none", "--n-ctx", "256"]
    with serving(*args, "--threads", "1") as url:
        names = {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]}
        body = {"model": "good.gguf", "prompt": "hi", "max_tokens": 2, "temperature": 0}
        good = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        bad = httpx.post(f"{url}/v1/completions", json={**body, "model": "nan.gguf"}, timeout=60)
    assert {"good.gguf", "nan.gguf"} <= names and good.status_code == 200, good.text
    assert bad.status_code >= 400 and bad.status_code != 500  # the pool's answer for a model that cannot load
    assert "nan.gguf" in bad.text and "llama.context_length" in bad.text


def test_the_table_prints_names_and_headers_that_look_like_markup(home, tiny):
    """`draftwise models` (the table): a folder 'a[/b]' and an architecture '[/x]' are printed
    as they are, not read as rich markup (an unmatched closing tag stopped the listing)."""
    (home / "a[" / "b]").mkdir(parents=True)
    (home / "a[" / "b]" / "x.gguf").write_bytes(tiny.read_bytes())
    write(home / "b.gguf", parse(tiny).with_kv("general.architecture", STRING, "[/x]"))
    write(home / "c.gguf", parse(tiny).with_kv("llama.context_length", STRING, "[bold]"))
    table = CliRunner().invoke(main, ["models", "--models-dir", str(home)])
    assert table.exit_code == 0, table.output
    assert "a[/b]/x.gguf" in table.output and "[/x]" in table.output
    assert "cannot use c.gguf (folder)" in table.output and "'[bold]'" in table.output
