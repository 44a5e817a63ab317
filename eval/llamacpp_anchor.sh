#!/usr/bin/env bash
# vocabjax beside llama.cpp on the same GGUF files (eval/llamacpp_anchor.py): builds llama.cpp
# from llama-cpp-python's sdist (its vendored sources, this host's native flags: GGML_NATIVE)
# into $BUILD once, installs the binding over that library, then runs the comparison.
#   bash eval/llamacpp_anchor.sh [--out DIR] [--limit N] ...   (arguments go to the script)
set -euo pipefail
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
BUILD=${BUILD:-$HOME/.cache/vocabjax/llamacpp-$VERSION}
SRC=$BUILD/llama_cpp_python-$VERSION
mkdir -p "$BUILD"
if [ ! -x "$BUILD/build/bin/llama-speculative-simple" ]; then
  if [ ! -d "$SRC" ]; then
    pip download "llama-cpp-python==$VERSION" --no-binary :all: --no-deps -d "$BUILD"
    tar xzf "$BUILD/llama_cpp_python-$VERSION.tar.gz" -C "$BUILD"
  fi
  # AMX tiles off on a host that lists them (vocabjax's kernel does not use them either):
  # GGML_NATIVE builds ggml's AMX matmuls there, and a VM that does not hand its processes the
  # tile state (Xeon guests seen here) kills the first one with an illegal instruction
  NO_AMX=()
  if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    NO_AMX=("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
            "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
  fi
  cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF \
    "${NO_AMX[@]}" | tee "$BUILD/cmake.log"
  cmake --build "$BUILD/build" -j "$(nproc)" --target llama llama-speculative-simple
fi
python -c "import llama_cpp" 2>/dev/null || \
  CMAKE_ARGS="-DLLAMA_BUILD=OFF" pip install "$SRC"
grep -E "GGML_NATIVE|CMAKE_C_FLAGS|AVX|x86" "$BUILD/build/CMakeCache.txt" | head -20 \
  > "$BUILD/build_flags.txt" || true
python eval/llamacpp_anchor.py --llama-lib "$BUILD/build/bin" \
  --speculative "$BUILD/build/bin/llama-speculative-simple" "$@"
