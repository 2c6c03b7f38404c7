#!/usr/bin/env bash
# The README's main job: set up, build, prepare the corpora, train the CPU preset on tiny
# Shakespeare, then print samples from the checkpoint. Extra arguments are config overrides,
# e.g. scripts/train_shakespeare.sh --max_iters=500.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DNANOGPT_BUILD_TESTS=OFF
build/nanogpt prepare --input data/shakespeare_char/input.txt --out_dir data/shakespeare_char
build/nanogpt prepare --input data/tang_poems/input.txt --out_dir data/tang_poems
build/nanogpt train configs/shakespeare_char_cpu.yaml "$@"
build/nanogpt sample --out_dir=out-shakespeare-char-cpu --num_samples=3 --max_new_tokens=500
