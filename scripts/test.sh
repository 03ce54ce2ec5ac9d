#!/usr/bin/env bash
# Set up with the test extras, check lint and formatting (ruff, config in pyproject.toml; CI
# checks the layout, it never rewrites it), build the documentation site (mkdocs.yml: offline, and
# --strict fails on a broken link or a page outside the nav), and run the whole test suite (unit,
# statistical, llama.cpp on tiny generated models, the server, and the real default pair, fetched
# on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test,hf
. .venv/bin/activate
ruff check src tests scripts docs/bench
ruff format --check src tests scripts docs/bench
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet  # the variable only silences Material's end-of-life banner
python -m pytest -q "$@"
