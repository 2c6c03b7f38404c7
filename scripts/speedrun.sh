#!/usr/bin/env bash
# Time to nanoGPT's loss, on this machine. nanoGPT's CPU preset (its README's command line:
# 4 layers x 4 heads x 128, block 64, batch 12, 2000 iterations) trains to iteration 2000 with
# --compile=False and --compile=True; the faster one's time and its final val loss are the mark. Then
# each of our configs trains, evaluated every 50 iterations on the same val split with the same
# eval_iters (20), and its time to the first evaluation at or below that loss is printed beside
# nanoGPT's, as a ratio. The same for the Tang poems with nanoGPT's preset shaped as
# configs/tang_poems_cpu.yaml (4 x 4 x 192, block 64, batch 16).
#
#   scripts/speedrun.sh NANOGPT_DIR [shakespeare|tang|both]
#
# Time is training time: the sum of the logged step times up to that evaluation (ours: the
# [train] lines' ms, the steps alone; nanoGPT: its per-iteration dt with --eval_interval=2000, less
# iteration 0, which holds its start-up, compilation and first evaluation, counted as a median step).
# Evaluations, checkpoints and start-up are left out of both. ROUNDS (default 1) repeats everything,
# nanoGPT and ours alternating; the last table gives each round and the median ratio.
# Environment: THREADS (default: all cores), NANOGPT_COMPILE ("False True"), SHAKESPEARE_CONFIGS and
# TANG_CONFIGS (our configs to try, space-separated). Run it on an otherwise idle machine. To measure
# what a CPU without AVX-512 does on one that has it, cap both programs' libraries and our kernels:
#   ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 NANOGPT_KERNELS=avx2 scripts/speedrun.sh ...
set -euo pipefail
usage="usage: scripts/speedrun.sh NANOGPT_DIR [shakespeare|tang|both]"
[[ -f ${1:?$usage}/train.py ]] || { echo "[speedrun] error: '$1' is not a nanoGPT checkout (no train.py there); $usage" >&2; exit 2; }
nanogpt_dir=$(cd "$1" && pwd)
corpora=${2:-both}
case $corpora in
  shakespeare | tang) ;;
  both) corpora="shakespeare tang" ;;
  *) echo "[speedrun] error: corpus '$corpora' is not shakespeare, tang or both" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
source scripts/env.sh
source scripts/nanogpt_peer.sh
nanogpt_program
py=$NANOGPT_PYTHON
threads=${THREADS:-$(nproc)}
export OMP_NUM_THREADS=$threads
rounds=${ROUNDS:-1}
read -r -a compile_modes <<<"${NANOGPT_COMPILE:-False True}"
read -r -a configs_shakespeare <<<"${SHAKESPEARE_CONFIGS:-configs/shakespeare_char_cpu.yaml configs/shakespeare_char_speedrun_cpu.yaml}"
read -r -a configs_tang <<<"${TANG_CONFIGS:-configs/tang_poems_cpu.yaml configs/tang_poems_speedrun_cpu.yaml}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nanogpt_peer_workspace "$nanogpt_dir" "$work" "$py"
[[ $corpora == *tang* ]] && nanogpt_peer_tang "$work" "$py"
"$NANOGPT" prepare --input data/shakespeare_char/input.txt --out_dir data/shakespeare_char >/dev/null
[[ $corpora == *tang* ]] && "$NANOGPT" prepare --input data/tang_poems/input.txt --out_dir data/tang_poems >/dev/null
"$py" -c 'import torch; print("[speedrun] torch", torch.__version__, "| threads", torch.get_num_threads())'
echo "[speedrun] $("$NANOGPT" --version 2>/dev/null | head -1) | $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

# nanoGPT's log -> "seconds val": the sum of dt over iterations 1..N-1 plus their median for iteration 0,
# and the val loss of its last evaluation.
nanogpt_time() {
  "$py" - "$1" <<'PY'
import re, statistics, sys
text = open(sys.argv[1], errors="replace").read()
dt = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", text)}
val = re.findall(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", text)
last = int(val[-1][0])
steps = [dt[i] for i in range(1, last) if i in dt]
print(f"{(sum(steps) + statistics.median(steps)) / 1000:.2f} {val[-1][1]}")
PY
}
# Our metrics.csv and a target -> "seconds iterations val": the step times before the first evaluation
# at or below the target, that evaluation's iteration and loss; "- - best@iter" when none reached it.
ours_time() {
  "$py" - "$1" "$2" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
target = float(sys.argv[2])
ms = {int(r["iter"]): float(r["ms"]) for r in rows if r["split"] == "train"}
val = [(int(r["iter"]), float(r["loss"])) for r in rows if r["split"] == "val"]
hit = next(((i, v) for i, v in val if v <= target), None)
if hit is None:
    i, v = min(val, key=lambda p: p[1])
    print(f"- - {v:.4f}@{i}")
else:
    print(f"{sum(t for i, t in ms.items() if i < hit[0]) / 1000:.2f} {hit[0]} {hit[1]:.4f}")
PY
}

nano_shakespeare=(config/train_shakespeare_char.py --device=cpu --eval_iters=20 --log_interval=1 --block_size=64
                  --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
                  --dropout=0.0 --eval_interval=2000)
nano_tang=(config/train_shakespeare_char.py --device=cpu --dataset=tang --eval_iters=20 --log_interval=1 --block_size=64
           --batch_size=16 --n_layer=4 --n_head=4 --n_embd=192 --max_iters=2000 --lr_decay_iters=2000
           --dropout=0.0 --eval_interval=2000)
rows=()
for round in $(seq "$rounds"); do
  for corpus in $corpora; do
    declare -n nano_args="nano_$corpus" configs="configs_$corpus"
    best="" target=""
    for mode in "${compile_modes[@]}"; do
      echo "[speedrun] round $round, $corpus: nanoGPT --compile=$mode to iteration 2000"
      log=$work/nano_${corpus}_$mode.log
      (cd "$work/nanoGPT" && "$py" train.py "${nano_args[@]}" --compile="$mode" --out_dir="$work/nano_out" >"$log" 2>&1) ||
        { echo "[speedrun] nanoGPT --compile=$mode failed:"; tail -3 "$log"; continue; }
      read -r s val < <(nanogpt_time "$log")
      echo "[speedrun]   $s s, val $val"
      rows+=("$round | $corpus | nanoGPT --compile=$mode | 2000 | $val | $s | ")
      if [[ -z $best || $(echo "$s < $best" | bc -l) == 1 ]]; then best=$s target=$val; fi
    done
    [[ -n $best ]] || { echo "[speedrun] error: no nanoGPT run finished: no mark to reach" >&2; exit 1; }
    echo "[speedrun] round $round, $corpus: the mark is val $target, reached by nanoGPT in $best s"
    for config in "${configs[@]}"; do
      name=$(basename "$config" .yaml)
      echo "[speedrun] round $round, $corpus: $name to val $target"
      "$NANOGPT" train "$config" --out_dir="$work/$name" --eval_interval=50 --eval_iters=20 --log_interval=1 \
        --plot=false --num_threads="$threads" >"$work/$name.log" 2>&1 ||
        { echo "[speedrun] $name failed:"; tail -3 "$work/$name.log"; exit 1; }
      read -r s iters val < <(ours_time "$work/$name/metrics.csv" "$target")
      if [[ $s == - ]]; then
        echo "[speedrun]   not reached (best val $val)"
        rows+=("$round | $corpus | $name | - | $val | - | -")
      else
        ratio=$(echo "scale=3; $s / $best" | bc -l)
        echo "[speedrun]   $s s at iteration $iters (val $val): ${ratio}x nanoGPT's time"
        rows+=("$round | $corpus | $name | $iters | $val | $s | $ratio")
      fi
      rm -rf "${work:?}/$name"
    done
    unset -n nano_args configs
  done
done

echo
echo "| round | corpus | run | iterations | val | seconds to the mark | / nanoGPT's best |"
echo "|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "| $r |"; done
if ((rounds > 1)); then
  printf '%s\n' "${rows[@]}" | "$py" -c '
import statistics, sys
ratios = {}
for line in sys.stdin:
    f = [x.strip() for x in line.split("|")]
    if f[-1] not in ("", "-"): ratios.setdefault((f[1], f[2]), []).append(float(f[-1]))
for (corpus, run), r in ratios.items():
    print(f"[speedrun] {corpus} {run}: median {statistics.median(r):.3f}x nanoGPT over {len(r)} rounds")'
fi
