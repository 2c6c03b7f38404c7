#!/usr/bin/env bash
# The modern recipe's ablation (docs/perf-log.md, "Beyond nanoGPT's recipe"): each switch alone on top of the
# Shakespeare CPU preset, all together (the modern preset), modern + Muon and two other combinations,
# 2000 iterations, a few seeds each; prints the final val loss of every run, then mean ± sd per row.
#
#   scripts/ablation.sh                         # every row, seeds 1337 2 3, each config's own lr
#   ROWS='^(base|modern)$' LR=2e-3 SEEDS=1337 scripts/ablation.sh   # a one-seed learning-rate probe
#   ROWS='muon' MUON_LR=0.04 scripts/ablation.sh
# docs/perf-log.md's tuned table is, besides the default run (relu2, swiglu and modern + Muon are best at
# the presets' rates): ROWS='^(base|rmsnorm|qk_norm|untied|softcap15|wsd)$' LR=4e-3, ROWS='^modern$'
# LR=5e-4, ROWS='^muon$' LR=2e-3 MUON_LR=0.01.
#
# Environment: NANOGPT (binary, default build/nanogpt), ROWS (regex over row names), SEEDS, LR (AdamW
# learning_rate; min_lr is set to LR/10 as in the presets; empty = the config's 1e-3), MUON_LR (empty =
# 0.02), JOBS (runs at a time, 2), THREADS (--num_threads per run, 1), NICE (19), RUNS (out_dirs,
# runs/ablation), EXTRA (more --key=value overrides, e.g. --max_iters=20 for a smoke test), STOP_AT
# (HH:MM UTC: start no run after it), RESULTS (a TSV that every finished run is appended to,
# RUNS/results.tsv).
# A run whose out_dir already holds a finished train.log is not run again, only reported.
set -euo pipefail
cd "$(dirname "$0")/.."
export NANOGPT=${NANOGPT:-build/nanogpt} SEEDS=${SEEDS:-"1337 2 3"} LR=${LR:-} MUON_LR=${MUON_LR:-}
export STOP_AT=${STOP_AT:-} EXTRA=${EXTRA:-} JOBS=${JOBS:-2} THREADS=${THREADS:-1} NICE=${NICE:-19} RUNS=${RUNS:-runs/ablation}
export RESULTS=${RESULTS:-$RUNS/results.tsv}
ROWS=${ROWS:-.}

cpu=configs/shakespeare_char_cpu.yaml
modern=configs/shakespeare_char_modern_cpu.yaml
# name | config | overrides
table="base|$cpu|
rmsnorm|$cpu|--norm=rmsnorm
qk_norm|$cpu|--qk_norm=true
relu2|$cpu|--mlp=relu2
swiglu|$cpu|--mlp=swiglu
untied|$cpu|--tie_embeddings=false
softcap15|$cpu|--logit_softcap=15
wsd|$cpu|--lr_schedule=wsd --decay_frac=0.2
muon|$cpu|--optimizer=muon
modern|$modern|
modern+muon|$modern|--optimizer=muon
modern-swiglu|$modern|--mlp=swiglu
relu2+qk_norm+wsd|$cpu|--mlp=relu2 --qk_norm=true --lr_schedule=wsd --decay_frac=0.2"

one() {  # name config overrides seed
  local name=$1 config=$2 overrides=$3 seed=$4 extra="" tag=""
  if [[ -n $LR ]]; then
    extra="--learning_rate=$LR --min_lr=$(awk -v l="$LR" 'BEGIN { printf "%g", l / 10 }')"
  fi
  local lr=${LR:-1e-3} mlr=-
  if [[ $overrides == *muon* ]]; then
    mlr=${MUON_LR:-0.02}
    [[ -n $MUON_LR ]] && extra="$extra --muon_learning_rate=$MUON_LR"
    tag="-mlr$mlr"
  fi
  local run="$name-lr$lr$tag-s$seed" dir="$RUNS/$name-lr$lr$tag-s$seed"
  if ! grep -q '\[train\] done' "$dir/train.log" 2>/dev/null; then
    [[ -n $STOP_AT && $(date -u +%H:%M) > $STOP_AT ]] && { echo "SKIPPED $run (past STOP_AT $STOP_AT UTC)"; return; }
    # shellcheck disable=SC2086
    nice -n "$NICE" "$NANOGPT" train "$config" $overrides $extra $EXTRA --seed="$seed" --out_dir="$dir" \
      --plot=false --num_threads="$THREADS" >"$dir.out" 2>&1 || { echo "FAILED $run (see $dir.out)"; return; }
  fi
  local final best ms
  final=$(grep '\[eval\]' "$dir/train.log" | tail -1 | sed 's/.*val //')
  best=$(grep '\[train\] done' "$dir/train.log" | sed 's/.*best val \([0-9.]*\).*/\1/')
  ms=$(grep '\[train\] done' "$dir/train.log" | sed 's/.*median \([0-9.]*\) ms.*/\1/')
  grep -q "^$run	" "$RESULTS" && { grep "^$run	" "$RESULTS"; return; }
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$run" "$name" "$config ${overrides:-(preset)}" "$lr" "$mlr" \
    "$seed" "$THREADS" "$final" "$best" "$ms" | tee -a "$RESULTS"
}
export -f one

mkdir -p "$RUNS"
[[ -s $RESULTS ]] || printf 'run\trow\tswitches\tlr\tmuon_lr\tseed\tthreads\tfinal_val\tbest_val\tms_iter\n' >"$RESULTS"
while IFS='|' read -r name config overrides; do
  [[ $name =~ $ROWS ]] || continue
  for seed in $SEEDS; do printf '%s\0%s\0%s\0%s\0' "$name" "$config" "$overrides" "$seed"; done
done <<<"$table" | xargs -0 -n 4 -P "$JOBS" bash -c 'one "$@"' _

# mean ± sd (n-1) of the final val per row and learning rate, over every run in RESULTS
echo
awk -F'\t' 'NR > 1 { k = $2 "\tlr " $4 ($5 == "-" ? "" : " muon " $5) "\t" $7 " thr"; n[k]++; s[k] += $8; q[k] += $8 * $8 }
  END { for (k in n) { m = s[k] / n[k]; sd = n[k] > 1 ? sqrt(((v = q[k] - n[k] * m * m) > 0 ? v : 0) / (n[k] - 1)) : 0
                       printf "%-12s\tn=%d\t%.4f ± %.4f\n", k, n[k], m, sd } }' "$RESULTS" | sort
