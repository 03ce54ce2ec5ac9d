#!/usr/bin/env bash
# Set up with the test extras and run the whole test suite (unit, statistical, llama.cpp
# on tiny generated models, the server, and the real default pair, fetched on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test,hf
. .venv/bin/activate
python -m pytest -q "$@"
