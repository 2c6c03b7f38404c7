# Sourced by the set-up and build scripts: the one place that pins the LibTorch we build against
# and says where its Python environment lives. The environment sits in a cache folder outside the
# clone, so a second clone (CI's fresh one) on the same machine reuses it instead of downloading
# PyTorch again (~2.5 GB with its CUDA libraries).
NANOGPT_TORCH_VERSION=2.11.0
NANOGPT_CACHE_DIR=${NANOGPT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nanogpt-cpp}
NANOGPT_VENV=${NANOGPT_VENV:-$NANOGPT_CACHE_DIR/torch-$NANOGPT_TORCH_VERSION}
NANOGPT_PYTHON=$NANOGPT_VENV/bin/python

# Finds that environment's LibTorch for CMake (build.sh, sanitize.sh, fuzz.sh): sets NANOGPT_TORCH_CMAKE
# (torch.utils.cmake_prefix_path) and NANOGPT_TORCH_ARGS (the configure arguments naming it and the
# Python); both empty, and a non-zero return, when torch is not installed there.
nanogpt_find_torch() {
  NANOGPT_TORCH_ARGS=()
  NANOGPT_TORCH_CMAKE=$("$NANOGPT_PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) ||
    { NANOGPT_TORCH_CMAKE=""; return 1; }
  NANOGPT_TORCH_ARGS=(-DCMAKE_PREFIX_PATH="$NANOGPT_TORCH_CMAKE" -DNANOGPT_PYTHON="$NANOGPT_PYTHON")
}

# torchrun from that environment (it is not on PATH): the scripts start several processes with it,
# and `source scripts/env.sh` gives it to a shell, e.g. "$NANOGPT_TORCHRUN" --no-python --standalone
# --nproc_per_node=2 build/nanogpt train CONFIG.
export NANOGPT_TORCHRUN=${NANOGPT_TORCHRUN:-$NANOGPT_VENV/bin/torchrun}

# The program the scripts run: build/nanogpt (scripts/build.sh), or the one NANOGPT_BIN names (an
# installed one: cmake --install build --prefix P puts it in P/bin).
nanogpt_program() {
  local bin=${NANOGPT_BIN:-build/nanogpt}
  [[ -x $bin ]] || { echo "[nanogpt] error: no program at '$bin': build it with scripts/build.sh, or set NANOGPT_BIN" >&2; return 1; }
  NANOGPT=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
}
