# Sourced by the set-up and build scripts: the one place that pins the LibTorch we build against
# and says where its Python environment lives. The environment sits in a cache folder outside the
# clone, so a second clone (CI's fresh one) on the same machine reuses it instead of downloading
# PyTorch again (~2.5 GB with its CUDA libraries).
NANOGPT_TORCH_VERSION=2.11.0
NANOGPT_CACHE_DIR=${NANOGPT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nanogpt-cpp}
NANOGPT_VENV=${NANOGPT_VENV:-$NANOGPT_CACHE_DIR/torch-$NANOGPT_TORCH_VERSION}
NANOGPT_PYTHON=$NANOGPT_VENV/bin/python

# The configure arguments that point CMake at that environment's LibTorch and Python, one per line
# (for build.sh, sanitize.sh and fuzz.sh); prints nothing and fails when torch is not installed there.
nanogpt_torch_cmake_args() {
  local prefix
  prefix=$("$NANOGPT_PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) || return 1
  printf '%s\n' "-DCMAKE_PREFIX_PATH=$prefix" "-DNANOGPT_PYTHON=$NANOGPT_PYTHON"
}
