#!/usr/bin/env bash
# Set up with the test extras (and chromium, for the chat page's browser test), check lint and
# formatting (ruff, config in pyproject.toml; CI checks the layout, it never rewrites it), build the
# documentation site (mkdocs.yml: offline, and --strict fails on a broken link or a page outside
# the nav), and run the whole test suite (unit, statistical, llama.cpp on tiny generated models,
# the server, the chat page in a browser, and the real default pair, fetched on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test,hf
. .venv/bin/activate
# The chat page's browser test (tests/server/test_page_browser.py) drives Debian's chromium through
# chromedriver: installed here when this runs as root with apt-get. A failed install fails
# nothing: the test then skips and says what is missing.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! { command -v chromium && command -v chromedriver; } >/dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } >/dev/null 2>&1 \
        || echo "chromium and chromium-driver could not be installed: the browser test will skip" >&2
fi
ruff check src tests scripts docs/bench
ruff format --check src tests scripts docs/bench
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet  # the variable only silences Material's end-of-life banner
python -m pytest -q "$@"
