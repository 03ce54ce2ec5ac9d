"""A bench run on a scripted toy model, its report.html, and a screenshot of the page's token
sources (docs/img/bench-report.png) taken with headless chromium.

The toy target answers each prompt with a fixed text, one character a token (the toy backend's
character tokenizer): a code edit that renames a function's arguments (its prediction is the file
before the edit), a chat answer written afresh, and a JSON record under a schema. So the page
shows, in seconds and without model weights, what a real run's shows: an edit copied from the
prediction and the prompt, chat written by the target, the grammar's forced tokens.

    PYTHONPATH=src python scripts/bench_report_screenshot.py [--out DIR] [--png docs/img/bench-report.png]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from draftwise.backends.toy import DEFAULT_ALPHABET, CharTokenizer, ToyBackend
from draftwise.bench.reports.report import write_report
from draftwise.bench.suites.prompts import Prompt
from draftwise.bench.sweep.runner import BenchConfig, run_bench
from draftwise.drafters import NgramDrafter
from draftwise.drafters.prediction import PredictionDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.engine import Engine

BEFORE = (
    "def area(w, h):\n"
    '    """The area of a w by h rectangle."""\n'
    "    if w < 0 or h < 0:\n"
    '        raise ValueError("negative side")\n'
    "    return w * h\n"
)
AFTER = BEFORE.replace("w, h", "width, height").replace("w by h", "width by height")
AFTER = AFTER.replace("w < 0 or h < 0", "width < 0 or height < 0").replace("w * h", "width * height")
CHAT = (
    "Tea reached Europe in the early 1600s, first as a costly medicine sold by apothecaries. "
    "Within a century it was the everyday drink of kitchens from London to Lisbon.\n"
)
RECORD = '{"name": "Ada Lovelace", "born": 1815, "field": "mathematics"}'
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "born": {"type": "integer"}, "field": {"type": "string"}},
    "required": ["name", "born", "field"],
    "additionalProperties": False,
}
PROMPTS = [
    Prompt(1, "code_edit", (f"Rename w to width and h to height:\n{BEFORE}",), prediction=(BEFORE,)),
    Prompt(2, "chat", ("When did tea come to Europe?",)),
    Prompt(3, "structured_schema", ("Ada Lovelace, born 1815, mathematician. As JSON.",), json_schema=SCHEMA),
]
ANSWERS = {"Rename": AFTER, "When did": CHAT, "Ada": RECORD}


def scripted_target() -> ToyBackend:
    """A toy target that writes ANSWERS[the prompt's first words], then EOS (EOS too wherever the
    context is not a prompt and the start of its answer: the warm-up's text, a rejected draft)."""
    tokenizer = CharTokenizer(len(DEFAULT_ALPHABET) + 1)
    vocab = tokenizer.vocab_size

    def logits(context) -> np.ndarray:
        text = tokenizer.decode(context)
        start = text.find("\na:") + 3  # the toy chat template: "u:{prompt}\na:"
        answer = next((a for key, a in ANSWERS.items() if text.startswith(f"u:{key}")), "")
        written = text[start:] if start >= 3 else None
        row = np.zeros(vocab)
        if written is not None and answer.startswith(written) and len(written) < len(answer):
            row[tokenizer.encode(answer[len(written)])[0]] = 12.0
        else:
            row[0] = 12.0  # EOS
        return row

    return ToyBackend(logits_fn=logits, vocab_size=vocab, tokenizer=tokenizer)


def screenshot(page: Path, png: Path, width: int = 1200, height: int = 1600) -> None:
    """The last `height` pixels of the page's content (the time account and the token sources):
    chromium shoots the whole page in a tall window, the blank rows below the content are cut."""
    from PIL import Image  # matplotlib's own dependency

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit(f"chromium is not installed (Debian: apt-get install chromium); the page is {page}")
    with tempfile.TemporaryDirectory() as tmp:
        tall = Path(tmp) / "tall.png"
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--screenshot={tall}",
                f"--window-size={width},{4 * height}",
                page.resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        image = Image.open(tall).convert("RGB")
        rows = np.asarray(image).min(axis=(1, 2)) < 250  # rows with anything drawn on them
        end = min(image.height, int(np.nonzero(rows)[0][-1]) + 24)
        png.parent.mkdir(parents=True, exist_ok=True)
        shot = image.crop((0, max(0, end - height), width, end))
        shot.quantize(colors=256).save(png, optimize=True)  # a palette PNG: a third of the size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="Run folder (default: a temporary one).")
    parser.add_argument("--png", type=Path, default=Path("docs/img/bench-report.png"))
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-report-"))
    engine = Engine(scripted_target(), [NgramDrafter(1, 3), SuffixDrafter(), PredictionDrafter()])
    config = BenchConfig(methods=("baseline", "auto", "ngram"), max_tokens=256)
    results = run_bench(engine, PROMPTS, config, out, meta={"target": "scripted toy", "prompts": "3 scripted"})
    write_report(results, out)
    screenshot(out / "report.html", args.png)
    print(f"report: {out / 'report.html'}\nscreenshot: {args.png}")


if __name__ == "__main__":
    main()
