#!/usr/bin/env bash
# Configures and builds nanogpt-cpp (Release) into build/. Extra arguments go to CMake's
# configure step, e.g. scripts/build.sh -DNANOGPT_BUILD_TESTS=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ ! -f build/CMakeCache.txt ]]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
elif (($#)); then
  cmake -S . -B build "$@"
fi
cmake --build build -j"$(nproc)"
