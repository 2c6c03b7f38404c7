#!/usr/bin/env bash
# Configures and builds nanogpt-cpp (Release) into build/ against the LibTorch of scripts/setup.sh's
# environment. Extra arguments go to CMake's configure step, e.g. scripts/build.sh -DNANOGPT_BUILD_TESTS=OFF,
# or -DCMAKE_PREFIX_PATH=/path/to/libtorch for an unpacked official LibTorch instead. Without the CUDA
# toolkit (nvcc) the build is CPU only: CMake says so once, and skips the CUDA plugin.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if nanogpt_find_torch; then
  # A build folder configured against another LibTorch (an older pin, Debian's 1.13) starts afresh.
  if [[ -f build/CMakeCache.txt ]] && ! grep -q "^Torch_DIR:PATH=$NANOGPT_TORCH_CMAKE/Torch\$" build/CMakeCache.txt &&
     [[ " $* " != *CMAKE_PREFIX_PATH* ]]; then
    echo "[build] build/ was configured against another LibTorch: reconfiguring"
    rm -f build/CMakeCache.txt
  fi
elif [[ " $* " != *CMAKE_PREFIX_PATH* && ! -f build/CMakeCache.txt ]]; then
  echo "[build] error: no LibTorch: run scripts/setup.sh, or pass -DCMAKE_PREFIX_PATH=/path/to/libtorch" >&2
  exit 1
fi
if [[ ! -f build/CMakeCache.txt ]]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${NANOGPT_TORCH_ARGS[@]}" "$@"
elif (($#)); then
  cmake -S . -B build "$@"
fi
cmake --build build -j"$(nproc)"
echo "[build] the program: $PWD/build/nanogpt (to install it: cmake --install build --prefix DIR, then DIR/bin/nanogpt)"
