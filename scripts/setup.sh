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
# llama.cpp built with -march=native on a CPU with AMX (Sapphire Rapids and later) routes the
# default Q4_K_M model through its AMX kernels, which crash there (segfault in
# ggml_backend_amx_mul_mat, llama.cpp issue 20824). Build without them; GCC's explicit -mno-*
# options win over -march=native, so every other instruction set of the host is kept.
# A build that has them (or none) is replaced.
if [ "$(uname -m)" = x86_64 ] && ! python - 2>/dev/null <<'PY'
import sys, llama_cpp
sys.exit("AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode())
PY
then
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_C_FLAGS='$no_amx' -DCMAKE_CXX_FLAGS='$no_amx'" \
    python -m pip install -q --disable-pip-version-check --no-cache-dir --force-reinstall --no-deps \
    "llama-cpp-python==0.3.36"
fi
if [ -n "$extras" ]; then
  python -m pip install -q --disable-pip-version-check -e ".[$extras]"
else
  python -m pip install -q --disable-pip-version-check -e .
fi
