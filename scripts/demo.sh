#!/usr/bin/env bash
# Set up, fetch the default model pair (about 1.6 GB, cached) and compare plain decoding
# with speculative decoding (n-gram, draft model, auto) on one prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
draftwise pull
draftwise demo "$@"
