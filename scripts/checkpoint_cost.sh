#!/usr/bin/env bash
# What a checkpoint costs the training thread: trains a preset twice, saving ckpt_last every few
# iterations, once with saves written in the background (checkpoint_async: true) and once on the
# training thread (false), and prints per mode: the write's time, the time training was held per
# save (the whole write, or the snapshot copy), the time of the step right after a save (in the
# background the write overlaps it) against the other steps (medians), and the run's wall time.
#
#   scripts/checkpoint_cost.sh [CONFIG] [--key=value ...]     (default: configs/shakespeare_char.yaml)
#   env: NANOGPT_BIN (default build/nanogpt), ITERS (default 25), EVERY (save interval, default 4),
#        WORK (a folder to keep the runs in; default a temporary one, removed), MODES (default
#        "true false"), REPORT_ONLY=1 (print the table from the runs already in WORK)
# Evaluation is cut to one batch per split, at the start and the end only: the runs measure saves.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${NANOGPT_BIN:-build/nanogpt}
config=configs/shakespeare_char.yaml
if [[ $# -gt 0 && $1 != --* ]]; then config=$1; shift; fi
iters=${ITERS:-25}
every=${EVERY:-4}
[[ -x $bin ]] || { echo "error: no program at '$bin': build it first (scripts/build.sh)" >&2; exit 1; }
work=${WORK:-}
if [[ -z $work ]]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/nanogpt_checkpoint_cost.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else printf "%.0f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

printf '%-17s %6s %9s %8s %22s %15s %7s\n' checkpoint_async saves "write ms" "held ms" "step ms (after a save)" "step ms (other)" "wall s"
for async in ${MODES:-true false}; do
  out=$work/async_$async
  [[ -n ${REPORT_ONLY:-} ]] || "$bin" train "$config" --out_dir="$out" --max_iters="$iters" --checkpoint_interval="$every" --checkpoint_async=$async \
    --eval_interval=100000 --eval_iters=1 --log_interval=1 --plot=false "$@" >"$out.log" 2>&1 ||
    { tail -3 "$out.log"; exit 1; }
  # "[ckpt] saved DIR/ckpt_last.safetensors (iter N, W ms[ in the background; training paused P ms])"
  saves=$(grep -o 'ckpt_last.safetensors (iter [0-9]*, [0-9]* ms[^)]*)' "$out/train.log" | grep -v "iter $iters,")
  write_ms=$(sed -E 's/.*, ([0-9]+) ms.*/\1/' <<<"$saves" | median)
  if [[ $async == true ]]; then held_ms=$(sed -E 's/.*paused ([0-9]+) ms.*/\1/' <<<"$saves" | median); else held_ms=$write_ms; fi
  save_iters=" $(sed -E 's/.*\(iter ([0-9]+),.*/\1/' <<<"$saves" | tr '\n' ' ')"
  # The step logged as iter N runs right after the save at N: in the background the write overlaps it.
  # Steps 0-1 (warm-up) are left out.
  steps=$(awk -F, 'NR > 1 && $2 == "train" && $1 >= 2 { print $1, $5 }' "$out/metrics.csv")
  during=$(while read -r i ms; do if [[ $save_iters == *" $i "* ]]; then echo "$ms"; fi; done <<<"$steps" | median)
  others=$(while read -r i ms; do if [[ $save_iters != *" $i "* ]]; then echo "$ms"; fi; done <<<"$steps" | median)
  wall=$(grep -o 'wall [0-9.]* s' "$out/train.log" | tail -1 | grep -o '[0-9.]*')
  printf '%-17s %6s %9s %8s %22s %15s %7s\n' "$async" "$(grep -c . <<<"$saves")" "$write_ms" "$held_ms" "$during" "$others" "$wall"
done
