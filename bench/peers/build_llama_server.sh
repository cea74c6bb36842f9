#!/usr/bin/env bash
# Build llama.cpp's native `llama-server` from the sources vendored in the PyPI
# llama-cpp-python sdist (Debian packages no llama.cpp). Takes ~15 minutes on two cores,
# so it is never part of `make test` / CI; bench/peers/compare_peers.py uses the result
# when it exists and says how to build it when it does not.
#
#   bash bench/peers/build_llama_server.sh            # -> bench/peers/.build/llama-server
#
# Environment:
#   PEERS_DIR          where to unpack and build (default bench/peers/.build, git-ignored)
#   LLAMA_CPP_SDIST    an already downloaded llama_cpp_python-*.tar.gz (skips pip download)
#   LLAMA_CPP_VERSION  the sdist version to download (default 0.3.36)
#   JOBS               parallel compile jobs (default: number of cores)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
peers_dir="${PEERS_DIR:-$here/.build}"
version="${LLAMA_CPP_VERSION:-0.3.36}"
jobs="${JOBS:-$(nproc)}"
mkdir -p "$peers_dir"

sdist="${LLAMA_CPP_SDIST:-}"
if [[ -z "$sdist" ]]; then
    sdist="$peers_dir/llama_cpp_python-$version.tar.gz"
    if [[ ! -f "$sdist" ]]; then
        python3 -m pip download --no-binary :all: --no-deps --dest "$peers_dir" \
            "llama-cpp-python==$version"
    fi
fi

src="$peers_dir/llama_cpp_python-$version/vendor/llama.cpp"
if [[ ! -f "$src/CMakeLists.txt" ]]; then
    tar -xzf "$sdist" -C "$peers_dir"
fi

# Native CPU build (GGML_NATIVE: -march=native, so AVX-512 where the host has it), one
# static binary, no network features: the server only ever reads a local GGUF file.
cmake -S "$src" -B "$src/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON
cmake --build "$src/build" --target llama-server -j "$jobs"

install -m 0755 "$src/build/bin/llama-server" "$peers_dir/llama-server"
# The converter and its gguf-py package come from the same tree, so the GGUF format
# always matches the binary that reads it.
ln -sfn "$src" "$peers_dir/llama.cpp"
echo "built $peers_dir/llama-server"
