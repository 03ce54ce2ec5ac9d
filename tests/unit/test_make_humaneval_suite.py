"""scripts/make_humaneval_suite.py: HumanEval's problems as bench prompts, split by task number."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_humaneval_suite.py"


def problem(n: int) -> dict:
    prompt = f'\n\ndef f{n}(x: int) -> int:\n    """Return x plus {n}.\n    >>> f{n}(1)\n    {n + 1}\n    """\n'
    return {
        "task_id": f"HumanEval/{n}",
        "prompt": prompt,
        "canonical_solution": f"    return x + {n}\n",
        "entry_point": f"f{n}",
    }


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_problems_become_chat_prompts_in_a_dev_and_a_test_split(tmp_path):
    source = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(source, "wt") as f:
        f.writelines(json.dumps(problem(n)) + "\n" for n in range(10))
    result = run("--problems", str(source), "--per-split", "3", "--out-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    splits = {
        name: [json.loads(line) for line in (tmp_path / "out" / f"{name}.jsonl").read_text().splitlines()]
        for name in ("dev", "test")
    }
    assert all((r["question_id"] - 9000) % 2 == 0 for r in splits["dev"])
    assert all((r["question_id"] - 9000) % 2 == 1 for r in splits["test"])
    assert [len(s) for s in splits.values()] == [3, 3]
    record = splits["test"][0]
    n = record["question_id"] - 9000
    assert record["category"] == "humaneval" and record["entry_point"] == f"f{n}"
    turn = record["turns"][0]
    assert turn.startswith("Complete the following Python function.") and f"```python\ndef f{n}(x: int)" in turn
    assert turn.endswith('    """\n```')


def test_a_file_without_problems_is_a_clear_error(tmp_path):
    source = tmp_path / "other.jsonl"
    source.write_text(json.dumps({"question_id": 1}) + "\n")
    result = run("--problems", str(source), "--out-dir", str(tmp_path / "out"))
    assert result.returncode == 1 and "holds no HumanEval problems" in result.stderr
