#!/usr/bin/env bash
# Installs the Debian 12 packages nanogpt-cpp needs, only those that are missing, then checks
# that BLAS is OpenBLAS (Debian's reference BLAS makes LibTorch's matmuls ~25x slower).
set -euo pipefail

packages=(cmake g++ ninja-build libtorch-dev libyaml-cpp-dev libspdlog-dev libgtest-dev libcli11-dev
          libstb-dev libgloo-dev libopenblas0-openmp)

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
  echo "[setup] all packages present"
fi

blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)
if [[ $blas != *openblas* ]]; then
  echo "[setup] warning: libblas.so.3 points at '${blas:-nothing}', not OpenBLAS: LibTorch will be ~25x slower." >&2
  echo "[setup]          fix: sudo update-alternatives --config libblas.so.3-x86_64-linux-gnu" >&2
fi
