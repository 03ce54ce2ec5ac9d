import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# Under pytest-xdist (scripts/test.sh runs `-n 2 --dist loadgroup`) each of these files runs on
# one worker: a Ray cluster per test file, and the real model pair loaded once, not twice.
XDIST_GROUPS = {"test_ray.py": "ray", "test_real_pair.py": "real-pair"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        group = XDIST_GROUPS.get(item.path.name)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def tiny_gguf_dir(tmp_path_factory):
    from tiny_gguf import write_tiny_gguf

    root = tmp_path_factory.mktemp("gguf")
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    write_tiny_gguf(root / "target.gguf", seed=0, chat_template=template)
    write_tiny_gguf(root / "draft.gguf", seed=1, scale=0.3)
    write_tiny_gguf(root / "twin.gguf", seed=0)  # identical weights: a perfect draft
    return root
