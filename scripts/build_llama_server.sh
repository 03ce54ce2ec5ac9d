#!/usr/bin/env bash
# Build llama.cpp's llama-server, the peer `draftwise bench-serve --peer llama-server...` measures
# against, from the llama.cpp that the pinned llama-cpp-python sdist vendors (the one draftwise runs
# on), for this host's CPU. Prints the binary's path; a finished build is reused.
#
#   scripts/build_llama_server.sh              # ~/.cache/draftwise/llama-server/0.3.36/bin/llama-server
#   JOBS=1 nice scripts/build_llama_server.sh  # on a shared machine
#
# Several minutes on 2 cores. The binary stays in the cache, never in the repository.
set -euo pipefail
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"  # the version scripts/setup.sh pins
cache="${XDG_CACHE_HOME:-$HOME/.cache}/draftwise/llama-server/$version"
binary="$cache/bin/llama-server"
if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi
mkdir -p "$cache"
src="$cache/llama_cpp_python-$version"
if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
  sdist="$cache/llama_cpp_python-$version.tar.gz"
  if [ ! -f "$sdist" ]; then
    download="$(mktemp -d)"
    trap 'rm -rf "$download"' EXIT
    # NOTE: --no-binary for this one package (not :all:): pip still prepares the sdist's metadata,
    # and :all: would build its build requirements from source too.
    python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$version" -d "$download" >&2
    mv "$download/llama_cpp_python-$version.tar.gz" "$sdist"
  fi
  tar -xzf "$sdist" -C "$cache"
fi
flags=""
# NOTE: as in scripts/setup.sh: llama.cpp's AMX kernels crash on the default Q4_K_M model (llama.cpp
# issue 20824); GCC's explicit -mno-* win over -march=native, so the host's other extensions stay.
if [ "$(uname -m)" = x86_64 ]; then
  flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
build="$cache/build"
cmake -S "$src/vendor/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >&2
cmake --build "$build" --target llama-server -j "${JOBS:-$(nproc)}" >&2
mkdir -p "$cache/bin"
# The copy is the last step, so a build that stopped half way leaves no binary to reuse.
cp "$build/bin/llama-server" "$binary.tmp"
mv "$binary.tmp" "$binary"
echo "$binary"
