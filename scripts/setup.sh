#!/usr/bin/env bash
# Create .venv (if missing) and install draftwise with the given extras, e.g. `scripts/setup.sh test,hf`.
# llama-cpp-python compiles from source the first time (about 4-7 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --disable-pip-version-check --upgrade pip
if [ -n "$extras" ]; then
  python -m pip install -q --disable-pip-version-check -e ".[$extras]"
else
  python -m pip install -q --disable-pip-version-check -e .
fi
