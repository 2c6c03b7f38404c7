#!/usr/bin/env bash
# Installs what nanogpt-cpp needs, only what is missing: the Debian 12 packages (build tools and
# libraries), then PyTorch (pinned in scripts/env.sh) from Python's package index into a virtual
# environment in a cache folder outside the clone. The wheel carries a complete LibTorch (headers,
# CMake config, CPU and CUDA libraries, its own OpenMP runtime); CMake finds it through
# torch.utils.cmake_prefix_path (scripts/build.sh). numpy and safetensors: the nanoGPT bridge
# (scripts/nanogpt_bridge.py) reads and writes with them. The same environment runs nanoGPT side by side.
#
#   scripts/setup.sh          what building, training, sampling, serving and plotting need
#   scripts/setup.sh --tests  that, and the tools the test suite drives the program with: GoogleTest,
#                             Chromium, curl, an Arm cross compiler, and Python's transformers,
#                             safetensors, openai and sentencepiece packages
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
tests=0
for a in "$@"; do
  case $a in
    --tests) tests=1 ;;
    *) echo "[setup] error: unknown argument '$a' (scripts/setup.sh [--tests])" >&2; exit 2 ;;
  esac
done

# Drawing: cairo and pango with fonts for Latin (DejaVu) and CJK (WenQuanYi Zen Hei). libgloo-dev:
# Gloo's headers for training on several CPU processes (the Gloo library itself is inside LibTorch).
# libtcmalloc-minimal4: the nanogpt program's malloc (runtime/host_memory.h: less memory when training).
# libcpp-httplib-dev: the HTTP server of `nanogpt serve`. libsentencepiece-dev: trains and runs the
# optional subword tokenizer (`prepare --tokenizer=bpe`). libpcre2-dev: the Unicode-aware regular
# expressions of imported Hugging Face tokenizers (`import --format=hf`).
packages=(cmake g++ ninja-build python3 python3-venv libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev
          nlohmann-json3-dev libcairo2-dev libpango1.0-dev fonts-dejavu-core fonts-wqy-zenhei libgloo-dev
          libtcmalloc-minimal4 libcpp-httplib-dev libsentencepiece-dev libpcre2-dev)
# The suite's tools: GoogleTest; chromium for the attention explorer's and the playground's browser
# tests; curl, a client for the server's tests; g++-aarch64-linux-gnu compiles the hand-written
# kernels for 64-bit Arm too. (A test whose tool is missing skips, saying why.)
test_packages=(libgtest-dev chromium curl g++-aarch64-linux-gnu)
((tests)) && packages+=("${test_packages[@]}")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "[setup] installing: ${missing[*]}"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "[setup] error: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "[setup] all Debian packages present"
fi

# PyTorch: reuse the cached environment when it is complete and holds the pinned version. The
# marker file is written last, so an interrupted install is redone, never taken for a complete one.
have=""
if [[ -f $NANOGPT_VENV/.nanogpt-complete ]]; then
  have=$("$NANOGPT_PYTHON" -c 'import torch, numpy, safetensors; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
fi
if [[ $have == "$NANOGPT_TORCH_VERSION" ]]; then
  echo "[setup] torch $NANOGPT_TORCH_VERSION present in $NANOGPT_VENV"
else
  echo "[setup] installing torch==$NANOGPT_TORCH_VERSION into $NANOGPT_VENV (one download of ~2.5 GB, cached for later set-ups)"
  python=/usr/bin/python3  # Debian's (python3-venv above); a pyenv or conda python3 may lack venv
  [[ -x $python ]] || python=$(command -v python3)
  rm -rf "$NANOGPT_VENV"
  mkdir -p "$NANOGPT_CACHE_DIR"
  "$python" -m venv "$NANOGPT_VENV"
  if ! "$NANOGPT_PYTHON" -m pip install -q --disable-pip-version-check "torch==$NANOGPT_TORCH_VERSION" numpy safetensors; then
    echo "[setup] error: could not install torch==$NANOGPT_TORCH_VERSION from the package index (offline? see pip's message above)" >&2
    exit 1
  fi
  touch "$NANOGPT_VENV/.nanogpt-complete"
fi
"$NANOGPT_PYTHON" -c "import torch; print('[setup] LibTorch', torch.__version__, '(CUDA', str(torch.version.cuda) + ')', 'at', torch.utils.cmake_prefix_path)"
# The suite's Python packages: transformers (pinned: tests/test_export_hf.cpp loads what `nanogpt export --format=hf` writes with it),
# the openai client (the serving tests drive `nanogpt serve` with it) and sentencepiece (a test
# compares its encoding with the bpe tokenizer's), tokenizers (trains the Hugging Face tokenizers that the
# import tests read; transformers brings it too). The tests that need one skip, saying why, without it.
if ((tests)); then
  transformers_version=5.25.0
  python_packages=("transformers==$transformers_version" openai sentencepiece tokenizers)
  if "$NANOGPT_PYTHON" -c "import sys, openai, sentencepiece, tokenizers, transformers
sys.exit(transformers.__version__ != '$transformers_version')" 2>/dev/null; then
    echo "[setup] the suite's Python packages present: ${python_packages[*]}"
  else
    echo "[setup] installing the suite's Python packages into $NANOGPT_VENV: ${python_packages[*]}"
    if ! "$NANOGPT_PYTHON" -m pip install -q --disable-pip-version-check "${python_packages[@]}"; then
      echo "[setup] error: could not install ${python_packages[*]} from the package index (offline? see pip's message above)" >&2
      exit 1
    fi
  fi
fi
# torchrun comes with the torch wheel; the distributed tests skip without it, so a wheel lacking it is an error.
if [[ ! -x $NANOGPT_TORCHRUN ]]; then
  echo "[setup] error: no torchrun at $NANOGPT_TORCHRUN (it comes with torch): remove $NANOGPT_VENV and run scripts/setup.sh again" >&2
  exit 1
fi
echo "[setup] torchrun, for several processes: $NANOGPT_TORCHRUN (scripts/env.sh exports it as NANOGPT_TORCHRUN)"
if ! nvcc --version >/dev/null 2>&1 && ! /usr/local/cuda/bin/nvcc --version >/dev/null 2>&1; then
  echo "[setup] no CUDA toolkit (nvcc): the build will be CPU only; for GPU runs, install the CUDA toolkit of LibTorch's CUDA version above"
fi
