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
