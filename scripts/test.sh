#!/usr/bin/env bash
# Set up with the test extras and run the whole test suite (unit, statistical, llama.cpp
# on tiny generated models, the server, and the real default pair, fetched on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test,hf
. .venv/bin/activate
# Two workers (pytest-xdist): most tests run one Python thread, so the two cores share the work.
python -m pytest -q -n 2 --dist loadgroup "$@"
