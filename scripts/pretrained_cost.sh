#!/usr/bin/env bash
# What a GPT-2 (124M) from Hugging Face costs here, measured without the hub: scripts/pretrained_cost.py
# makes a GPT2LMHeadModel of GPT-2's shape with random weights and a byte-level BPE tokenizer.json trained
# on tiny Shakespeare (the folder `hf download openai-community/gpt2` gives, same sizes), then the program
#   imports it (import --format=hf: wall time and peak RSS, from /usr/bin/time -v),
#   samples from it on the CPU in float32, bfloat16 and with int8 weights (its own "[sample] ... tok/s" line,
#   best of 2; 20-token runs beside them split off the start's cost: the prefill, the decoder's packing),
#   tokenizes Shakespeare with its tokenizer (prepare --tokenizer_from) and fine-tunes it a few iterations
#   with configs/finetune_shakespeare.yaml (train --init_from; the median ms/iter of its [train] lines,
#   the first, warm-up iteration left out).
# Random weights cost what trained ones do: the same shapes, the same arithmetic.
#
#   usage: scripts/pretrained_cost.sh [WORK_DIR]     (default: a temporary folder, removed at the end)
#   env: NANOGPT_BIN (default build/nanogpt); TOKENS (new tokens per sample, default 200); SAMPLE_MODES
#        (default "float32 bfloat16 int8": a --dtype, or int8 / int4 for --quantize); ITERS (fine-tune
#        iterations, default 3); ACCUM (gradient_accumulation_steps, default 2: the recipe's 32 takes 16 times
#        as long an iteration); TRAIN_DTYPES (default float32: training in bfloat16 pays on CPUs that multiply
#        it in hardware, AVX-512 BF16 or AMX; `train` logs the bf16 GEMM peak it measured)
# Needs ~4 GB of disk in WORK_DIR (the import's checkpoint is 0.5 GB, each of the fine-tune's 1.5 GB with
# AdamW's moments) and
# Python's transformers and tokenizers (scripts/setup.sh --tests).
set -euo pipefail
if [[ $# -gt 1 || ${1:-} == -* ]]; then sed -n 's/^#   \(usage: .*\)/\1/p' "$0" >&2; exit 2; fi
cd "$(dirname "$0")/.."
source scripts/env.sh
nanogpt_program  # sets NANOGPT, or prints one line and fails
[[ -x /usr/bin/time ]] || { echo "error: no /usr/bin/time (GNU time): apt-get install time" >&2; exit 1; }
"$NANOGPT_PYTHON" -c 'import tokenizers, torch, transformers' 2>/dev/null ||
  { echo "error: '$NANOGPT_PYTHON' cannot import tokenizers, torch and transformers: run scripts/setup.sh --tests" >&2; exit 1; }
tokens=${TOKENS:-200}
iters=${ITERS:-3}
accum=${ACCUM:-2}
if [[ $# -eq 1 ]]; then
  work=$1
  mkdir -p "$work"
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/nanogpt_pretrained_cost.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
work=$(cd "$work" && pwd)
hf=$work/gpt2 ours=$work/gpt2-124M data=$work/shakespeare_gpt2
rm -rf "$hf" "$ours" "$data" "$work"/ft_*

fail() { echo "error: $1 failed; the last lines of $2:" >&2; tail -5 "$2" >&2; exit 1; }
# GNU time's fields: "Elapsed (wall clock) time (h:mm:ss or m:ss): 0:07.81", "Maximum resident set size (kbytes): N".
wall_s() { awk -F': ' '/Elapsed \(wall clock\)/ { n = split($2, t, ":"); s = 0; for (i = 1; i <= n; ++i) s = s * 60 + t[i]; printf "%.1f", s }' "$1"; }
peak_gb() { awk -F': ' '/Maximum resident set size/ { printf "%.2f", $2 / 1048576 }' "$1"; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else printf "%.0f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
rows=()
row() { rows+=("$(printf '%-52s %s' "$1" "$2")"); echo "  $1: $2"; }

echo "[cost] $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%F), $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; in $work"

echo "[cost] a GPT2LMHeadModel of GPT-2 (124M)'s shape, random weights, a tokenizer trained on Shakespeare"
/usr/bin/time -v -o "$work/make.time" "$NANOGPT_PYTHON" scripts/pretrained_cost.py data/shakespeare_char/input.txt "$hf" \
  >"$work/make.log" 2>&1 || fail "making the model" "$work/make.log"
grep '^\[model\]' "$work/make.log"
row "model.safetensors (fp32)" "$(du -m "$hf/model.safetensors" | cut -f1) MiB"

echo "[cost] import --format=hf"
/usr/bin/time -v -o "$work/import.time" "$NANOGPT" import --format=hf "$hf" --out_dir="$ours" >"$work/import.log" 2>&1 ||
  fail "import" "$work/import.log"
grep '^\[import\] wrote' "$work/import.log"
row "import --format=hf: wall, peak RSS" "$(wall_s "$work/import.time") s, $(peak_gb "$work/import.time") GiB"
row "import --format=hf: the folder it writes" "$(du -sm "$ours" | cut -f1) MiB"

# The tokens/s `sample` prints count everything after loading: the prompt's prefill and the first step,
# where the CPU decoder packs the weights, too. A run of $short tokens beside the $tokens-token ones gives
# that start's cost and the rate past it (from the best time of each length).
short=20
for mode in ${SAMPLE_MODES:-float32 bfloat16 int8}; do
  case $mode in
    int8 | int4) args=(--quantize="$mode") ;;  # its --dtype auto: bfloat16 where the CPU multiplies it, else float32
    *) args=(--dtype="$mode") ;;
  esac
  echo "[cost] sample --device=cpu ${args[*]}, $tokens new tokens (and $short), best of 2"
  best=0 wall= best_s=()
  for n in "$tokens" "$short"; do
    fastest=
    for run in 1 2; do
      log=$work/sample_${mode}_${n}_$run.log
      /usr/bin/time -v -o "$log.time" "$NANOGPT" sample --out_dir="$ours" --device=cpu "${args[@]}" --num_samples=1 \
        --max_new_tokens="$n" --seed="$run" --start="ROMEO:" >"$log" 2>&1 || fail "sample" "$log"
      # "[sample] 200 tokens in 9.87 s: 20 tok/s (KV cache, one sample at a time, cpu, float32)"
      line=$(grep '^\[sample\] [0-9]* tokens in' "$log")
      echo "    $line"
      seconds=$(sed -E 's/.* tokens in ([0-9.]+) s:.*/\1/' <<<"$line")
      if [[ -z $fastest ]] || awk -v a="$seconds" -v b="$fastest" 'BEGIN { exit !(a < b) }'; then fastest=$seconds; fi
      rate=$(sed -E 's/.*: ([0-9.]+) tok\/s.*/\1/' <<<"$line")
      if [[ $n == "$tokens" ]] && awk -v a="$rate" -v b="$best" 'BEGIN { exit !(a > b) }'; then best=$rate wall=$(wall_s "$log.time"); fi
    done
    best_s+=("$fastest")
  done
  row "sample ${args[*]}: tok/s (the command's wall)" "$best tok/s ($wall s)"
  row "  past the start: tok/s; the start (prefill, packing)" "$(awk -v n="$tokens" -v m="$short" -v a="${best_s[0]}" -v b="${best_s[1]}" \
    'BEGIN { r = (n - m) / (a - b); printf "%.0f tok/s; %.2f s", r, b - m / r }')"
done

echo "[cost] prepare --tokenizer_from (tiny Shakespeare)"
/usr/bin/time -v -o "$work/prepare.time" "$NANOGPT" prepare --tokenizer_from="$ours" --input data/shakespeare_char/input.txt \
  --out_dir="$data" >"$work/prepare.log" 2>&1 || fail "prepare" "$work/prepare.log"
grep '^\[data\]' "$work/prepare.log" | tail -2
row "prepare --tokenizer_from: wall" "$(wall_s "$work/prepare.time") s"

for dtype in ${TRAIN_DTYPES:-float32}; do
  echo "[cost] train configs/finetune_shakespeare.yaml --device=cpu --dtype=$dtype, $iters iterations of $accum micro-batches"
  log=$work/ft_$dtype.log
  /usr/bin/time -v -o "$log.time" "$NANOGPT" train configs/finetune_shakespeare.yaml --init_from="$ours" --dataset="$data" \
    --out_dir="$work/ft_$dtype" --device=cpu --dtype="$dtype" --max_iters="$iters" --gradient_accumulation_steps="$accum" \
    --eval_iters=1 --plot=false >"$log" 2>&1 || fail "train" "$log"
  # "[train] iter 2 | loss 10.9541 | lr 3.00e-05 | 21034.5 ms | 97 tok/s | mfu 0.1%"
  grep '^\[train\] iter' "$log" | sed 's/^/    /'
  all_ms=$(grep '^\[train\] iter' "$log" | sed -E 's/.*\| ([0-9.]+) ms \|.*/\1/')
  if [[ $(grep -c . <<<"$all_ms") -gt 1 ]]; then all_ms=$(tail -n +2 <<<"$all_ms"); fi
  ms=$(median <<<"$all_ms")
  per_micro=$(awk -v ms="$ms" -v k="$accum" 'BEGIN { printf "%.0f", ms / k }')
  row "train --dtype=$dtype: ms/iter ($accum x 1024 tokens)" "$ms ms ($per_micro ms a sequence)"
  row "train --dtype=$dtype: the command's wall, peak RSS" "$(wall_s "$log.time") s, $(peak_gb "$log.time") GiB"
done

echo
printf '%-52s %s\n' "GPT-2 (124M) shape, CPU" "measured"
printf '%s\n' "${rows[@]}"
