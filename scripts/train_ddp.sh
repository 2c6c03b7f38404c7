#!/usr/bin/env bash
# One model trained by several processes (data parallel on c10d, README "train on several processes"):
# torchrun from scripts/setup.sh's environment starts NPROC (default 2) copies of build/nanogpt.
#   scripts/train_ddp.sh configs/shakespeare_char_cpu.yaml --max_iters=500
set -euo pipefail
cd "$(dirname "$0")/.." && source scripts/env.sh
exec "$NANOGPT_VENV/bin/torchrun" --no-python --standalone --nproc_per_node="${NPROC:-2}" build/nanogpt train "${@:-configs/shakespeare_char_cpu.yaml}"
