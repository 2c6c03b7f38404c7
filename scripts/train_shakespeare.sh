#!/usr/bin/env bash
# The README's main job: set up, build, prepare the corpora, train the CPU preset on tiny
# Shakespeare, then print samples from the checkpoint. Extra arguments are config overrides,
# e.g. scripts/train_shakespeare.sh --max_iters=500 --out_dir=out-mine (samples come from that folder).
# With NANOGPT_BIN set (an installed program), that program runs and nothing is set up or built.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z ${NANOGPT_BIN:-} ]]; then
  scripts/setup.sh
  if [[ -f build/CMakeCache.txt ]]; then
    scripts/build.sh
  elif [[ -e /dev/nvidiactl ]] || nvidia-smi -L >/dev/null 2>&1; then
    scripts/build.sh -DNANOGPT_BUILD_TESTS=OFF
  else
    # The CUDA plugin only runs on a GPU: on a machine without one, building it would be minutes of
    # compiling for nothing.
    echo "[train_shakespeare] no NVIDIA GPU here: building for the CPU (scripts/build.sh -DNANOGPT_CUDA=ON adds the CUDA plugin)"
    scripts/build.sh -DNANOGPT_BUILD_TESTS=OFF -DNANOGPT_CUDA=OFF
  fi
fi
source scripts/env.sh
nanogpt_program
echo "[train_shakespeare] program: $NANOGPT"
out_dir=out-shakespeare-char-cpu  # the preset's; an --out_dir=DIR override (the last one) wins
for a in "$@"; do [[ $a == --out_dir=* ]] && out_dir=${a#--out_dir=}; done
"$NANOGPT" prepare --input data/shakespeare_char/input.txt --out_dir data/shakespeare_char
"$NANOGPT" prepare --input data/tang_poems/input.txt --out_dir data/tang_poems
"$NANOGPT" train configs/shakespeare_char_cpu.yaml "$@"
echo "[train_shakespeare] samples from $out_dir"
"$NANOGPT" sample --out_dir="$out_dir" --num_samples=3 --max_new_tokens=500
