#!/usr/bin/env bash
# What the bpe tokenizer pays, measured: the CPU preset (configs/shakespeare_char_cpu.yaml) trained for
# the same wall-clock time on each dataset with the char tokenizer and with bpe at several vocabulary
# sizes, a few seeds each. Each (dataset, tokenizer) is prepared once into RUNS/data, a 30-iteration
# run measures its step time, and max_iters (= lr_decay_iters) is then chosen to fill BUDGET seconds.
# Val bits per character (the eval line's, comparable across tokenizers) is read at the end of each run.
# Prints a Markdown table (also written to RUNS/table.md) and one TSV row per run (RUNS/results.tsv).
#
#   scripts/tokenizer_table.sh                                  # the docs' table
#   BUDGET=10 SEEDS=1337 VOCABS=512 DATASETS=shakespeare_char scripts/tokenizer_table.sh   # a smoke test
#
# Environment: NANOGPT (binary, default build/nanogpt), BUDGET (seconds of training per run, 60), SEEDS
# ("1337 2"), VOCABS (bpe vocab_size values, "512 2048 8192"), DATASETS (folders under data/ holding
# input.txt, "shakespeare_char tang_poems"), THREADS (--num_threads per run, 1: runs stay comparable on a
# busy machine), EVAL_ITERS (batches per split in the final evaluation, 50), RUNS (runs/tokenizer_table).
set -euo pipefail
cd "$(dirname "$0")/.."
NANOGPT=${NANOGPT:-build/nanogpt} BUDGET=${BUDGET:-60} SEEDS=${SEEDS:-"1337 2"} VOCABS=${VOCABS:-"512 2048 8192"}
DATASETS=${DATASETS:-"shakespeare_char tang_poems"} THREADS=${THREADS:-1} EVAL_ITERS=${EVAL_ITERS:-50}
RUNS=${RUNS:-runs/tokenizer_table}
cpu=configs/shakespeare_char_cpu.yaml
tokens_per_iter=$((12 * 64))  # the preset's batch_size x block_size
[[ -x $NANOGPT ]] || { echo "tokenizer_table: no program at $NANOGPT (build it: scripts/build.sh)" >&2; exit 1; }
mkdir -p "$RUNS/data"
: >"$RUNS/results.tsv"

# Median milliseconds per iteration from a finished train.log.
median_ms() { sed -n 's/.*\[train\] done at iter .* | median \([0-9.]*\) ms\/iter.*/\1/p' "$1" | tail -1; }
# The last eval line's val bits/char.
val_bpc() { sed -n 's/.*\[eval\] iter .* | val bits\/char \([0-9.]*\).*/\1/p' "$1" | tail -1; }

train() {  # train OUT_DIR DATA_DIR overrides...: quiet, one thread, no plots
  local out=$1 data=$2
  shift 2
  "$NANOGPT" train "$cpu" --out_dir="$out" --dataset="$data" --num_threads="$THREADS" --plot=false \
    --log_interval=100 "$@" >"$out.stdout" 2>&1 || { echo "tokenizer_table: run $out failed, see $out.stdout" >&2; exit 1; }
}

rows=()
for dataset in $DATASETS; do
  for tok in char $VOCABS; do
    name=${dataset}_$tok
    data=$RUNS/data/$name
    if [[ $tok == char ]]; then args=(--tokenizer=char); else args=(--tokenizer=bpe --vocab_size="$tok"); fi
    start=$(date +%s.%N)
    summary=$("$NANOGPT" prepare --input "data/$dataset/input.txt" --out_dir "$data" "${args[@]}")
    prep_s=$(echo "$(date +%s.%N) - $start" | bc)
    vocab=$(sed -n 's/.*vocab_size=\([0-9]*\).*/\1/p' <<<"$summary")
    chars_per_token=$(sed -n 's/.*val_chars_per_token=\([0-9.]*\).*/\1/p' <<<"$summary")
    chars_per_token=${chars_per_token:-1}
    echo "[table] $name: prepared in ${prep_s}s: $summary" >&2

    train "$RUNS/cal_$name" "$data" --max_iters=30 --lr_decay_iters=30 --warmup_iters=3 --eval_interval=30 --eval_iters=1
    ms=$(median_ms "$RUNS/cal_$name/train.log")
    iters=$(echo "$BUDGET * 1000 / $ms" | bc)
    echo "[table] $name: $ms ms/iter -> $iters iterations for ${BUDGET}s" >&2

    bpcs=()
    tps=()
    for seed in $SEEDS; do
      out=$RUNS/${name}_s$seed
      train "$out" "$data" --seed="$seed" --max_iters="$iters" --lr_decay_iters="$iters" \
        --warmup_iters=$((iters / 20)) --eval_interval="$iters" --eval_iters="$EVAL_ITERS"
      bpc=$(val_bpc "$out/train.log")
      run_ms=$(median_ms "$out/train.log")
      tok_s=$(echo "$tokens_per_iter * 1000 / $run_ms" | bc)
      bpcs+=("$bpc")
      tps+=("$tok_s")
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$dataset" "$tok" "$vocab" "$seed" "$iters" "$tok_s" "$bpc" >>"$RUNS/results.tsv"
      echo "[table] $name seed $seed: val bits/char $bpc, $tok_s tok/s" >&2
    done
    mean_bpc=$(printf '%s\n' "${bpcs[@]}" | awk '{s += $1} END {printf "%.3f", s / NR}')
    mean_tps=$(printf '%s\n' "${tps[@]}" | awk '{s += $1} END {printf "%.0f", s / NR}')
    chars_s=$(echo "$mean_tps * $chars_per_token" | bc -l | xargs printf '%.0f')
    tokenizer=$([[ $tok == char ]] && echo char || echo "bpe $tok")
    rows+=("| $dataset | $tokenizer | $vocab | $chars_per_token | $iters | $mean_tps | $chars_s | $(printf '%s / ' "${bpcs[@]}" | sed 's| / $||') | **$mean_bpc** |")
  done
done

{
  echo "| dataset | tokenizer | vocab | chars/token (val) | iterations in ${BUDGET} s | tokens/s | chars/s | val bits/char per seed ($SEEDS) | mean |"
  echo "|---|---|---:|---:|---:|---:|---:|---|---:|"
  printf '%s\n' "${rows[@]}"
} | tee "$RUNS/table.md"
