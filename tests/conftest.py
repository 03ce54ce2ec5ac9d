import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

_USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
_SESSION_CACHE: Path | None = None


def pytest_configure(config):
    """A cache directory of the test session's own (calibrations of temporary tiny models stay out
    of the user's), whose models folder is the user's: the real pair is fetched once, ever."""
    global _SESSION_CACHE
    _SESSION_CACHE = Path(tempfile.mkdtemp(prefix="draftwise-test-cache-"))
    models = _USER_CACHE / "draftwise" / "models"
    models.mkdir(parents=True, exist_ok=True)
    (_SESSION_CACHE / "draftwise").mkdir()
    (_SESSION_CACHE / "draftwise" / "models").symlink_to(models, target_is_directory=True)
    os.environ["XDG_CACHE_HOME"] = str(_SESSION_CACHE)


def pytest_unconfigure(config):
    if _SESSION_CACHE is not None:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)  # removes the link, not the models


@pytest.fixture(scope="session")
def tiny_gguf_dir(tmp_path_factory):
    from tiny_gguf import write_tiny_gguf

    root = tmp_path_factory.mktemp("gguf")
    template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    write_tiny_gguf(root / "target.gguf", seed=0, chat_template=template)
    write_tiny_gguf(root / "draft.gguf", seed=1, scale=0.3)
    write_tiny_gguf(root / "twin.gguf", seed=0)  # identical weights: a perfect draft
    return root
