#!/usr/bin/env bash
# Benchmarks both Shakespeare presets on this machine (see `nanogpt bench --help`); JSON in bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/nanogpt ]] || scripts/build.sh
mkdir -p bench
build/nanogpt bench configs/shakespeare_char_cpu.yaml --iters 100 --json bench/shakespeare_char_cpu.json "$@"
build/nanogpt bench configs/shakespeare_char.yaml --device=cpu --iters 5 --warmup 1 --json bench/shakespeare_char.json "$@"
