import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_gguf_dir(tmp_path_factory):
    from tiny_gguf import write_tiny_gguf

    root = tmp_path_factory.mktemp("gguf")
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    write_tiny_gguf(root / "target.gguf", seed=0, chat_template=template)
    write_tiny_gguf(root / "draft.gguf", seed=1, scale=0.3)
    write_tiny_gguf(root / "twin.gguf", seed=0)  # identical weights: a perfect draft
    return root
