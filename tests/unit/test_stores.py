"""The user's own models (draftwise.stores): fake Ollama, LM Studio and Hugging Face stores in a
temporary home, holding tiny GGUF models of several families, each listed by `draftwise models`,
loaded by its store's name, and answering chat through the CLI and the server; bad input (an
unknown name, a truncated file, a missing blob, too little memory) is one error naming the file."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from draftwise import model_facts, models, stores
from draftwise.cli import main
from draftwise.errors import ModelError
from draftwise.gguf_header import GGUFError, read_header
from draftwise.loading import LoadOptions, load_engine
from tiny_gguf import write_tiny_gguf

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    "{% if tools %}<tool_call>{% endif %}"
)
GEMMA_TOKENS = ("<start_of_turn>", "<end_of_turn>")
LLAMA3_TOKENS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")
STORE_VARIABLES = ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "LLAMA_CACHE")


def _ollama_blob(root: Path, source: Path, name: str, tag: str, namespace: str = "library") -> Path:
    """source laid out in an Ollama store as `ollama pull` lays it out: a manifest naming a blob."""
    data = source.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    manifest = root / "manifests" / "registry.ollama.ai" / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    layers = [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data)},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return blob


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A home folder with models in Ollama's, LM Studio's and the hub's stores, and a folder of
    one's own (given with --models-dir)."""
    home = tmp_path_factory.mktemp("home")
    build = tmp_path_factory.mktemp("build")
    qwen = write_tiny_gguf(
        build / "qwen.gguf",
        architecture="qwen2",
        chat_template=CHATML,
        fim=True,
        special_tokens=CHATML_TOKENS,
        eot_token="<|im_end|>",
        name="Tiny Qwen",
    )
    gemma = write_tiny_gguf(build / "gemma.gguf", seed=2, special_tokens=GEMMA_TOKENS, eot_token="<end_of_turn>")
    ollama = home / ".ollama" / "models"
    _ollama_blob(ollama, qwen, "qwen-tiny", "1b")
    _ollama_blob(ollama, gemma, "gemma-tiny", "latest", namespace="someone")
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "gone" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        json.dumps({"layers": [{"mediaType": stores.OLLAMA_MODEL_LAYER, "digest": "sha256:" + "f" * 64}]})
    )

    lmstudio = home / ".lmstudio" / "models" / "lmstudio-community" / "Llama3-Tiny-GGUF"
    lmstudio.mkdir(parents=True)
    write_tiny_gguf(lmstudio / "llama3-tiny-Q8_0.gguf", seed=3, special_tokens=LLAMA3_TOKENS, eot_token="<|eot_id|>")
    write_tiny_gguf(lmstudio / "mmproj-llama3-tiny-f16.gguf", seed=3, architecture="clip")

    repo = home / ".cache" / "huggingface" / "hub" / "models--tiny-org--Base-Tiny-GGUF"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    base = write_tiny_gguf(repo / "blobs" / "9f8e7d", seed=4)
    (snapshot / "base-tiny.gguf").symlink_to(os.path.relpath(base, snapshot))
    write_tiny_gguf(snapshot / "split-tiny-00001-of-00002.gguf", seed=5, architecture="gemma3")
    write_tiny_gguf(snapshot / "split-tiny-00002-of-00002.gguf", seed=6, architecture="gemma3")

    own = home / "my-models"
    own.mkdir()
    data = (build / "qwen.gguf").read_bytes()
    (own / "cut.gguf").write_bytes(data[: len(data) // 2])  # a download cut short
    (own / "notes.gguf").write_text("not a model")
    return home


@pytest.fixture
def env(home, monkeypatch):
    """The process's environment pointed at the fake home, with no store variable set."""
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    for name in STORE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return home


def _found(home: Path) -> dict[str, stores.FoundModel]:
    roots = stores.StoreRoots.from_environment([home / "my-models"])
    return {m.name: m for m in stores.discover(roots).models if str(m.path).startswith(str(home))}


def run(*args):
    return CliRunner().invoke(main, list(args))


# ---------------------------------------------------------------------- discovery
def test_every_store_is_listed_with_its_names_and_facts(env):
    found = _found(env)
    assert {name: m.store for name, m in found.items() if m.problem is None} == {
        "qwen-tiny:1b": "ollama",
        "someone/gemma-tiny:latest": "ollama",
        "lmstudio-community/Llama3-Tiny-GGUF/llama3-tiny-Q8_0.gguf": "lmstudio",
        "tiny-org/Base-Tiny-GGUF/base-tiny.gguf": "huggingface",
        "tiny-org/Base-Tiny-GGUF/split-tiny-00001-of-00002.gguf": "huggingface",
    }
    qwen = found["qwen-tiny:1b"].facts
    assert (qwen.gguf_name, qwen.architecture, qwen.size_label) == ("Tiny Qwen", "qwen2", None)
    assert (qwen.vocab_size, qwen.context_length) == (268, 32768)
    assert (qwen.chat_template, qwen.tool_format, qwen.eot) == ("gguf", "hermes", "<|im_end|>")
    assert set(qwen.fim) >= {"prefix", "suffix", "middle", "file_sep"} and qwen.quantisation == "F32"
    gemma = found["someone/gemma-tiny:latest"].facts
    assert (gemma.chat_template, gemma.tool_format, gemma.eot, gemma.fim) == (
        "gemma (family default)",
        "json",  # no format of its own: calls as plain JSON objects
        "<end_of_turn>",
        {},
    )
    llama3 = found["lmstudio-community/Llama3-Tiny-GGUF/llama3-tiny-Q8_0.gguf"].facts
    assert llama3.chat_template == "llama3 (family default)" and llama3.eot == "<|eot_id|>"
    assert llama3.tool_format == "json"  # Llama 3.0's vocabulary: no <|python_tag|>
    base = found["tiny-org/Base-Tiny-GGUF/base-tiny.gguf"].facts
    assert (base.chat_template, base.tool_format) == ("none", None)
    split = found["tiny-org/Base-Tiny-GGUF/split-tiny-00001-of-00002.gguf"]
    one = read_header(split.path)
    assert split.facts.num_params == 2 * sum(t.num_elements for t in one.tensors)
    assert split.facts.chat_template == "gemma (family default)"  # by its architecture, gemma3


def test_unusable_files_are_reported_not_crashed_on(env):
    found = _found(env)
    assert "missing" in found["gone:latest"].problem and "f" * 64 in found["gone:latest"].problem
    assert "truncated" in found["cut.gguf"].problem and "cut.gguf" in found["cut.gguf"].problem
    roots = stores.StoreRoots.from_environment([env / "my-models"])
    skipped = {s.path.name: s.reason for s in stores.discover(roots).skipped}
    assert "mmproj" in skipped["mmproj-llama3-tiny-f16.gguf"]
    assert skipped["notes.gguf"] == "not a GGUF file"
    assert not any("00002-of" in name for name in found)  # a later part is listed through the first


def test_store_variables_move_the_stores(env, tmp_path, monkeypatch):
    moved = tmp_path / "elsewhere"
    (env / ".ollama" / "models").rename(moved)
    try:
        monkeypatch.setenv("OLLAMA_MODELS", str(moved))
        assert _found(env).keys().isdisjoint({"qwen-tiny:1b"})
        found = {m.name: m for m in stores.discover().models}
        assert found["qwen-tiny:1b"].path.parent == moved / "blobs"
    finally:
        moved.rename(env / ".ollama" / "models")


def test_names_resolve_to_files_in_place(env):
    blob = stores.resolve("qwen-tiny:1b")
    assert blob.path.parent == env / ".ollama" / "models" / "blobs" and blob.name == "qwen-tiny:1b"
    assert stores.resolve("someone/gemma-tiny").name == "someone/gemma-tiny:latest"  # :latest implied
    assert stores.resolve("llama3-tiny-Q8_0").store == "lmstudio"  # a file's stem, naming one model
    hub = stores.resolve("tiny-org/Base-Tiny-GGUF/base-tiny.gguf").path
    assert hub.is_symlink() and hub.resolve().parent.name == "blobs"  # the snapshot's link, not a copy


def test_an_unknown_name_lists_the_closest(env):
    with pytest.raises(ModelError) as caught:
        stores.resolve("qwen-tiny:2b")
    assert "qwen-tiny:1b" in str(caught.value) and "draftwise models" in str(caught.value)


def test_a_missing_blob_and_a_truncated_file_name_the_file(env):
    with pytest.raises(ModelError, match="sha256-f{64}.*missing"):
        stores.resolve("gone")
    with pytest.raises(GGUFError, match="cut.gguf: truncated"):
        stores.check_loadable(env / "my-models" / "cut.gguf", 256)
    (env / "head.gguf").write_bytes((env / "my-models" / "cut.gguf").read_bytes()[:40])
    with pytest.raises(GGUFError, match="head.gguf: truncated or corrupt"):
        read_header(env / "head.gguf")


def test_a_model_too_large_for_the_memory_left_is_refused_by_name(env, monkeypatch):
    monkeypatch.setattr(model_facts, "available_memory", lambda: 100 * 2**20)
    result = run("generate", "--target", "qwen-tiny:1b", "--prompt", "hi", "--max-tokens", "2", "--draft", "none")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "sha256-" in result.output and "GiB of memory is available" in result.output


# ---------------------------------------------------------------------- the CLI
def test_models_lists_every_store_as_json_and_as_a_table(env):
    result = run("models", "--json", "--models-dir", str(env / "my-models"))
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    rows = {row["name"]: row for row in data["models"]}
    assert rows["qwen-tiny:1b"]["store"] == "ollama" and rows["qwen-tiny:1b"]["tool_format"] == "hermes"
    assert rows["cut.gguf"]["store"] == "folder" and "truncated" in rows["cut.gguf"]["problem"]
    assert {s["store"] for s in data["searched"]} >= {"ollama", "lmstudio", "huggingface", "folder"}
    assert rows[models.DEFAULT_TARGET] == {  # the fake home's draftwise cache is empty
        "name": models.DEFAULT_TARGET,
        "store": "registry",
        "size_bytes": models.REGISTRY[models.DEFAULT_TARGET].size,
        "pulled": False,
    }
    table = run("models", "--models-dir", str(env / "my-models"))
    assert table.exit_code == 0, table.output
    for name in (
        "qwen-tiny:1b",
        "someone/gemma-tiny:latest",
        "lmstudio-community/Llama3-Tiny-GGUF/llama3-tiny-Q8_0.gguf",
        "gemma (family default)",
        "cannot use cut.gguf (folder)",
    ):
        assert name in table.output
    assert "skipped" in table.output and "mmproj" in table.output


@pytest.mark.parametrize(
    "target, chat_template",
    [
        ("qwen-tiny:1b", None),  # the GGUF's own template
        ("someone/gemma-tiny", None),  # gemma's, by the vocabulary's turn markers
        ("llama3-tiny-Q8_0", None),  # llama3's
        ("tiny-org/Base-Tiny-GGUF/base-tiny.gguf", "chatml"),  # none of its own: one by name
    ],
)
def test_each_family_answers_chat_through_the_cli(env, target, chat_template):
    args = ["generate", "--target", target, "--chat", "--prompt", "hi", "--max-tokens", "4", "--threads", "1"]
    args += ["--draft", "none", "--n-ctx", "256", "--json"]
    if chat_template:
        args += ["--chat-template", chat_template]
    result = run(*args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output.strip().splitlines()[-1])
    assert 1 <= len(data["token_ids"]) <= 4


def test_a_model_without_a_template_says_what_to_give(env):
    args = ["generate", "--target", "base-tiny", "--chat", "--prompt", "hi", "--max-tokens", "2", "--draft", "none"]
    result = run(*args, "--n-ctx", "256")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "base-tiny.gguf has no chat template" in result.output and "--chat-template" in result.output
    bad = run(*args, "--chat-template", "no-such-template")
    assert bad.exit_code == 2 and "gemma" in bad.output and "llama3" in bad.output


def test_a_jinja_file_is_a_chat_template(env, tmp_path):
    template = tmp_path / "turns.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] ")
    engine = load_engine("base-tiny", None, options=LoadOptions(n_ctx=256, chat_template=str(template)))
    try:
        text = engine.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
        assert text == "[user] hi\n[assistant] "
    finally:
        engine.target.close()


def test_an_unknown_target_through_the_cli(env):
    result = run("generate", "--target", "gemma-tiny:lates", "--prompt", "hi")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "someone/gemma-tiny:latest" in result.output


# ---------------------------------------------------------------------- the server
@pytest.mark.parametrize(
    "target",
    [
        "qwen-tiny:1b",  # Ollama's
        "someone/gemma-tiny:latest",
        "lmstudio-community/Llama3-Tiny-GGUF/llama3-tiny-Q8_0.gguf",  # LM Studio's
        "tiny-org/Base-Tiny-GGUF/base-tiny.gguf",  # the hub's: no template, so a plain completion
    ],
)
def test_a_store_model_answers_through_the_server(env, target):
    from draftwise.server import create_app
    from tests.server.conftest import LiveServer

    engine = load_engine(target, "ngram", options=LoadOptions(n_ctx=256, threads=1))
    chat = "base-tiny" not in target
    try:
        with LiveServer(engine, app=create_app(engine, target)) as live:
            body = {"model": target, "max_tokens": 4, "temperature": 0}  # greedy: the same answer every run
            body |= {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
            route = "/v1/chat/completions" if chat else "/v1/completions"
            reply = httpx.post(f"{live.url}{route}", json=body, timeout=60)
            models = httpx.get(f"{live.url}/v1/models", timeout=60).json()
        assert reply.status_code == 200, reply.text
        assert [m["id"] for m in models["data"]] == [target]
        if chat:
            assert reply.json()["choices"][0]["message"]["role"] == "assistant"
        assert reply.json()["usage"]["completion_tokens"] >= 1
    finally:
        engine.target.close()


def test_every_cut_of_a_header_is_an_error_naming_the_file(tmp_path):
    whole = write_tiny_gguf(tmp_path / "whole.gguf", special_tokens=GEMMA_TOKENS)
    data = whole.read_bytes()
    end = read_header(whole).data_offset
    for cut in [*range(0, end, 97), end - 1]:
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(GGUFError, match="cut.gguf"):
            read_header(tmp_path / "cut.gguf")
