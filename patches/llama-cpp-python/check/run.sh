#!/usr/bin/env bash
# Build ggml from the pinned llama-cpp-python sdist, plain and with small-batch-kernels.patch, and
# run the exactness check and the MUL_MAT benchmark against both (ggml only: a few minutes on 2 cores).
#
#   patches/llama-cpp-python/check/run.sh [WORKDIR]      # default /tmp/draftwise-kernels
#   NT=2 patches/llama-cpp-python/check/run.sh           # threads for the benchmark (default 1)
#
# The benchmark reports process CPU time (CPUTIME=1), which a shared host disturbs less than
# wall time; with NT=1 it is the kernels' work and memory stalls.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version=0.3.36
work="${1:-/tmp/draftwise-kernels}"
mkdir -p "$work"
cd "$work"
if [ ! -f "llama_cpp_python-$version.tar.gz" ]; then
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$version" -d .
fi
flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
for variant in base patched; do
  if [ ! -d "$variant" ]; then
    mkdir "$variant"
    tar -xzf "llama_cpp_python-$version.tar.gz" -C "$variant"
    if [ "$variant" = patched ]; then
      patch -d "$variant/llama_cpp_python-$version" -p1 --forward --quiet < "$here/../small-batch-kernels.patch"
    fi
  fi
  src="$variant/llama_cpp_python-$version/vendor/llama.cpp"
  cmake -S "$src" -B "$variant/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" > /dev/null
  cmake --build "$variant/build" --target ggml -j "${JOBS:-2}" > /dev/null
  libs="$variant/build/ggml/src/libggml.a $variant/build/ggml/src/libggml-cpu.a $variant/build/ggml/src/libggml-base.a"
  for prog in exact bench; do
    g++ -O2 -std=c++17 -I"$src/ggml/include" "$here/$prog.cpp" -o "$variant/$prog" $libs -fopenmp -lpthread
  done
done
base/exact one-row-base.bin > exact-base.txt 2>&1
patched/exact one-row-patched.bin | grep -v '^repack'
cmp one-row-base.bin one-row-patched.bin && echo "one-row outputs: bit-identical to the plain build"
for variant in base patched; do
  echo "== $variant"
  CPUTIME=1 NT="${NT:-1}" "$variant/bench" 3 | grep -v '^repack'
done
