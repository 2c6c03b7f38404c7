#!/usr/bin/env bash
# One model trained by several processes (data parallel on c10d): torchrun from scripts/setup.sh's
# environment ($NANOGPT_TORCHRUN, scripts/env.sh) starts NPROC (default 2) copies of build/nanogpt
# (or $NANOGPT_BIN). Arguments: a config (default configs/shakespeare_char_cpu.yaml), then overrides.
#   scripts/train_ddp.sh configs/shakespeare_char_cpu.yaml --max_iters=500
# The processes share gradient_accumulation_steps, so it must be a multiple of NPROC: when the config
# and the overrides give one that is not, the nearest multiple is used (each process runs that many
# micro-steps over NPROC), and the script says so.
set -euo pipefail
cd "$(dirname "$0")/.." && source scripts/env.sh
nanogpt_program
nproc=${NPROC:-2}
args=("$@")
if ((${#args[@]} == 0)) || [[ ${args[0]} == -* ]]; then args=(configs/shakespeare_char_cpu.yaml "${args[@]}"); fi
accum=""
for a in "${args[@]:1}"; do [[ $a == --gradient_accumulation_steps=* ]] && accum=${a#*=}; done
if [[ -z $accum ]]; then
  accum=$(sed -n 's/^gradient_accumulation_steps: *\([0-9]\+\).*/\1/p' "${args[0]}" 2>/dev/null | tail -n 1)
  accum=${accum:-1}
fi
if [[ $accum =~ ^[0-9]+$ ]] && ((accum % nproc != 0)); then
  per_process=$(((accum + nproc - 1) / nproc))
  echo "[train_ddp] gradient_accumulation_steps $accum -> $((per_process * nproc)): a multiple of the $nproc processes ($per_process micro-steps each)"
  args+=(--gradient_accumulation_steps=$((per_process * nproc)))
fi
echo "[train_ddp] $nproc processes of $NANOGPT (torchrun: $NANOGPT_TORCHRUN)"
exec "$NANOGPT_TORCHRUN" --no-python --standalone --nproc_per_node="$nproc" "$NANOGPT" train "${args[@]}"
