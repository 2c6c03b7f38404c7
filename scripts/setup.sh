#!/usr/bin/env bash
# Installs what nanogpt-cpp needs, only what is missing: the Debian 12 packages (build tools and
# libraries), then PyTorch (pinned in scripts/env.sh) from Python's package index into a virtual
# environment in a cache folder outside the clone. The wheel carries a complete LibTorch (headers,
# CMake config, CPU and CUDA libraries, its own OpenMP runtime); CMake finds it through
# torch.utils.cmake_prefix_path (scripts/build.sh). The environment also has numpy and safetensors
# for the Python checks in the test suite, transformers for the Hugging Face export's test, and
# serves to run nanoGPT side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

# Drawing: cairo and pango with fonts for Latin (DejaVu) and CJK (WenQuanYi Zen Hei); chromium for the
# attention explorer's browser test (which skips, saying why, without it). libgloo-dev: Gloo's headers
# for training on several CPU processes (the Gloo library itself is inside LibTorch).
# libtcmalloc-minimal4: the nanogpt program's malloc (runtime/host_memory.h: less memory when training).
# g++-aarch64-linux-gnu: the suite compiles the hand-written kernels for 64-bit Arm too.
# libcpp-httplib-dev: the HTTP server of `nanogpt serve`; curl: its tests drive it as a client would.
# libsentencepiece-dev: trains and runs the optional subword tokenizer (`prepare --tokenizer=bpe`).
packages=(cmake g++ ninja-build python3 python3-venv libyaml-cpp-dev libspdlog-dev libfmt-dev libgtest-dev
          libcli11-dev nlohmann-json3-dev libcairo2-dev libpango1.0-dev fonts-dejavu-core fonts-wqy-zenhei
          chromium libgloo-dev libtcmalloc-minimal4 g++-aarch64-linux-gnu libcpp-httplib-dev curl
          libsentencepiece-dev)

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
# transformers (pinned): tests/test_export_hf.cpp loads what `nanogpt export --format=hf` writes with it.
transformers_version=5.25.0
if "$NANOGPT_PYTHON" -c "import sys, transformers; sys.exit(transformers.__version__ != '$transformers_version')" 2>/dev/null; then
  echo "[setup] transformers $transformers_version present"
else
  echo "[setup] installing transformers==$transformers_version into $NANOGPT_VENV"
  if ! "$NANOGPT_PYTHON" -m pip install -q --disable-pip-version-check "transformers==$transformers_version"; then
    echo "[setup] error: could not install transformers==$transformers_version from the package index (offline? see pip's message above)" >&2
    exit 1
  fi
fi
"$NANOGPT_PYTHON" -c "import torch; print('[setup] LibTorch', torch.__version__, '(CUDA', str(torch.version.cuda) + ')', 'at', torch.utils.cmake_prefix_path)"

# The openai client: the serving tests drive `nanogpt serve` with it (they skip, saying why, without it).
if ! "$NANOGPT_PYTHON" -c 'import openai' 2>/dev/null; then
  echo "[setup] installing the openai client into $NANOGPT_VENV"
  "$NANOGPT_PYTHON" -m pip install -q --disable-pip-version-check openai ||
    echo "[setup] warning: could not install openai (offline?): the serving tests that use it will skip" >&2
fi
# SentencePiece's Python package: a test compares its encoding with the bpe tokenizer's (it skips without).
if ! "$NANOGPT_PYTHON" -c 'import sentencepiece' 2>/dev/null; then
  echo "[setup] installing sentencepiece (Python) into $NANOGPT_VENV"
  "$NANOGPT_PYTHON" -m pip install -q --disable-pip-version-check sentencepiece ||
    echo "[setup] warning: could not install sentencepiece (offline?): the test that compares with it will skip" >&2
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
