#!/usr/bin/env bash
# Data-parallel scale figures (docs/perf-log.md, "Data parallel on c10d") on this machine: tokens/s of one config with
# the same global batch (gradient_accumulation_steps=2) as
#   1 process x 2 threads | 2 processes x 1 thread (torchrun) | 2 "machines" (two torchrun --nnodes=2 on loopback)
# and Gloo's all-reduce bandwidth between 2 processes. Run it on a quiet machine.
#   scripts/ddp_scale.sh [CONFIG] [ITERS] [more --key=value]
set -euo pipefail
cd "$(dirname "$0")/.." && source scripts/env.sh
config=${1:-configs/shakespeare_char_cpu.yaml}
iters=${2:-200}
shift $(( $# > 2 ? 2 : $# ))
torchrun=$NANOGPT_TORCHRUN
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(train "$config" --gradient_accumulation_steps=2 --max_iters="$iters" --eval_interval=100000 --eval_iters=1
      --log_interval=1 --plot=false "$@")
median() {  # log -> "ms/iter tok/s" from the final [train] done line and the tokens per iteration
  local ms tpi
  ms=$(grep -o "median [0-9.]* ms/iter" "$1" | awk '{print $2}')
  tpi=$(grep -o "tokens per iteration will be: [0-9]*" "$1" | awk '{print $NF}')
  awk -v ms="$ms" -v t="$tpi" 'BEGIN { printf "%10.1f ms/iter %10.0f tok/s\n", ms, t / ms * 1000 }'
}
build/nanogpt "${args[@]}" --num_threads=2 --out_dir="$work/one" >"$work/one.log" 2>&1
printf '%-40s %s\n' "1 process x 2 threads" "$(median "$work/one.log")"
OMP_NUM_THREADS=1 "$torchrun" --no-python --standalone --nproc_per_node=2 build/nanogpt "${args[@]}" --num_threads=1 \
  --out_dir="$work/two" >"$work/two.log" 2>&1
printf '%-40s %s\n' "2 processes x 1 thread (torchrun)" "$(median "$work/two.log")"
port=$((29600 + RANDOM % 1000))
for node in 1 0; do
  OMP_NUM_THREADS=1 "$torchrun" --no-python --nnodes=2 --node_rank=$node --nproc_per_node=1 --master_addr=127.0.0.1 \
    --master_port=$port build/nanogpt "${args[@]}" --num_threads=1 --out_dir="$work/nodes" >"$work/node$node.log" 2>&1 &
done
wait
printf '%-40s %s\n' "2 machines x 1 process (loopback)" "$(median "$work/node0.log")"
OMP_NUM_THREADS=1 "$torchrun" --standalone --nproc_per_node=2 scripts/allreduce_bench.py 2>/dev/null | grep allreduce
