#!/usr/bin/env bash
# Side by side on this machine, in one run: nanogpt-cpp against nanoGPT's train.py and sample.py on
# the same PyTorch (the one scripts/setup.sh installed), as nanoGPT users run it: --compile=False,
# --compile=True, and the one-line CPU bf16 autocast patch (BF16_PATCH: a copy of train.py with that one line changed).
#
#   scripts/bench_vs_nanogpt.sh NANOGPT_DIR [BF16_PATCH]
#
# Prints, per run: CPU preset ms/iter (median of iterations 10..N) and val loss at N
# (N = CPU_ITERS, default 2000), full preset s/iter (median of FULL_ITERS, default 4, after one
# warm-up) and the peak resident memory of the full-preset run (/usr/bin/time's %M); then the CPU
# preset again in CPU_ROUNDS alternating rounds of CPU_ROUND_ITERS iterations (ours, nanoGPT, nanoGPT
# with the bf16 patch, back to back: the ratio without the minutes between the runs above); then the Tang
# poems CPU config against nanoGPT as it is and with the bf16 patch (TANG_ROUNDS alternating rounds of TANG_ITERS
# iterations); then sampling the CPU-preset and the full-preset model, 2,000 new tokens, start-up
# excluded (nanoGPT: the time for 2,000 tokens minus the time for 1; ours: the rate it prints for
# its generation): ours in its default dtype (auto), in fp32 and with --quantize=int8 and int4 (opt-in),
# nanoGPT's sample.py as it is (fp32 on a CPU) and with the bf16 patch's one-line change made to it,
# SAMPLE_ROUNDS alternating rounds;
# and the start-up of a sample (process start to its first output, and to the end), with the start-up
# floors of LibTorch in our program and of Python importing torch.
# Run it on an otherwise idle machine: a compiler on the other core slows LibTorch's threads far more
# than proportionally.
set -euo pipefail
nanogpt_dir=$(cd "${1:?usage: scripts/bench_vs_nanogpt.sh NANOGPT_DIR [BF16_PATCH]}" && pwd)
patch=${2:-$(dirname "$nanogpt_dir")/nanoGPT_cpu_bf16.py}
[[ -f $patch ]] && patch=$(cd "$(dirname "$patch")" && pwd)/$(basename "$patch")
cd "$(dirname "$0")/.."
source scripts/env.sh
source scripts/nanogpt_peer.sh
repo=$PWD
py=$NANOGPT_PYTHON
cpu_iters=${CPU_ITERS:-2000}
full_iters=${FULL_ITERS:-4}
warmup=$((cpu_iters < 200 ? cpu_iters / 2 : 100))  # the presets' 100; half of a quick trial run (nanoGPT divides by lr_decay_iters - warmup_iters)
threads=${THREADS:-$(nproc)}
export OMP_NUM_THREADS=$threads
[[ -x build/nanogpt ]] || { echo "error: build/nanogpt missing: run scripts/build.sh first" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nanogpt_peer_workspace "$nanogpt_dir" "$work" "$py"
"$py" -c 'import torch; print("[bench] torch", torch.__version__, "| threads", torch.get_num_threads())'
build/nanogpt prepare --input data/shakespeare_char/input.txt --out_dir data/shakespeare_char >/dev/null

median() {  # kind(ours|nanogpt) log min_iter -> "median_ms val"
  "$py" - "$@" <<'PY'
import re, statistics, sys
kind, path, lo = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(path, errors="replace").read()
if kind == "ours":
    ms = [float(m.group(2)) for m in re.finditer(r"\[train\] iter (\d+) \| loss [\d.]+ \| lr \S+ \| ([\d.]+) ms", text) if int(m.group(1)) >= lo]
    val = re.findall(r"\[eval\] iter \d+ \| train [\d.]+ \| val ([\d.]+)", text)
else:
    ms = [float(m.group(2)) for m in re.finditer(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", text) if int(m.group(1)) >= lo]
    val = re.findall(r"step \d+: train loss [\d.]+, val loss ([\d.]+)", text)
print(f"{statistics.median(ms) if ms else float('nan'):.2f} {val[-1] if val else 'n/a'}")
PY
}
seconds() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>&1 || return 1; t1=$(date +%s.%N); echo "$t1 - $t0" | bc -l; }
peak_gb() { awk '/^peak_kb / { printf "%.2f", $2 / 1048576 }' "$1"; }  # a log ending in time's "peak_kb N"
rss=(/usr/bin/time -a -f "peak_kb %M")
tok_per_s() { echo "scale=${4:-0}; ($1 - 1) / ($2 - $3)" | bc -l; }  # N t(N tokens) t(1 token) [decimals]: start-up excluded

cpu_nano=(config/train_shakespeare_char.py --device=cpu --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12
          --n_layer=4 --n_head=4 --n_embd=128 --max_iters="$cpu_iters" --lr_decay_iters="$cpu_iters" --dropout=0.0
          --eval_interval="$cpu_iters" --warmup_iters="$warmup")
full_nano=(config/train_shakespeare_char.py --device=cpu --max_iters="$full_iters" --eval_interval=100000 --eval_iters=1
           --log_interval=1 --always_save_checkpoint=False)
# The bf16 patch swaps contextlib.nullcontext for autocast; torch._dynamo (PyTorch 2.x) subclasses
# nullcontext when first imported, so it is imported before the patch runs.
cat >"$work/run_patch.py" <<'PY'
import runpy, sys
import torch._dynamo  # noqa: F401  (before the patch replaces contextlib.nullcontext)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
declare -A runner=([nanoGPT_fp32]="train.py --compile=False" [nanoGPT_compile]="train.py --compile=True"
                   [nanoGPT_bf16]="$work/run_patch.py $patch --compile=False")
# Why this machine cannot run a variant of nanoGPT ("" when it can), found once.
declare -A skip=([nanoGPT_fp32]="" [nanoGPT_compile]="" [nanoGPT_bf16]="")
if [[ ! -f $patch ]]; then skip[nanoGPT_bf16]="no $patch"
elif ! "$py" -c 'import sys, torch; sys.exit(not torch.ops.mkldnn._is_mkldnn_bf16_supported())'; then
  skip[nanoGPT_bf16]="this CPU has no hardware bf16 (LibTorch's bf16 GEMM is scalar code here)"
fi
# The CPU preset, ours, into $work/NAME and $work/NAME.log (the iterations as extra arguments); and a
# variant of nanoGPT's train.py with its arguments, into $work/NAME and $work/NAME.log.
ours_cpu_run() {  # name args... ; stops the script when ours fails
  build/nanogpt train configs/shakespeare_char_cpu.yaml --out_dir="$work/$1" --log_interval=1 --warmup_iters="$warmup" \
    --num_threads="$threads" "${@:2}" >"$work/$1.log" 2>&1 || { tail -3 "$work/$1.log"; exit 1; }
}
nano_run() {  # variant name args...
  local cmd
  read -r -a cmd <<<"${runner[$1]}"
  (cd "$work/nanoGPT" && "$py" "${cmd[@]}" "${@:3}" --out_dir="$work/$2" >"$work/$2.log" 2>&1)
}
# nanoGPT as it is and with the bf16 patch, back to back after one of our runs (ours_ms): prints
# " | ms/iter" (and " | val" when with_val is 1) for each, then " | the faster's ms / ours".
vs_nanogpt() {  # ours_ms log_suffix with_val nanoGPT_args...
  local out="" best="" name ms val
  for name in nanoGPT_fp32 nanoGPT_bf16; do
    ms="-" val="-"
    [[ -z ${skip[$name]} ]] && nano_run "$name" "${name}_$2" "${@:4}" &&
      read -r ms val < <(median nanogpt "$work/${name}_$2.log" 10)
    out+=" | $ms"
    [[ $3 == 1 ]] && out+=" | $val"
    [[ $ms != - && ( -z $best || $(echo "$ms < $best" | bc -l) == 1 ) ]] && best=$ms
  done
  echo "$out | $([[ -n $best ]] && echo "scale=2; $best / $1" | bc -l || echo -)"
}
rows=()

echo "[bench] nanogpt-cpp, CPU preset ($cpu_iters iterations)"
ours_cpu_run ours_cpu --max_iters="$cpu_iters" --lr_decay_iters="$cpu_iters" --eval_interval="$cpu_iters"
read -r ours_ms ours_val < <(median ours "$work/ours_cpu.log" 10)
echo "[bench] nanogpt-cpp, full preset ($full_iters iterations)"
"${rss[@]}" -o "$work/ours_full.log" build/nanogpt train configs/shakespeare_char.yaml --device=cpu --out_dir="$work/ours_full" \
  --log_interval=1 --max_iters="$full_iters" --eval_interval=100000 --eval_iters=1 --num_threads="$threads" \
  >>"$work/ours_full.log" 2>&1 || true
read -r ours_full _ < <(median ours "$work/ours_full.log" 1)
rows+=("nanogpt-cpp (dtype auto) | $ours_ms | $ours_val | $(echo "scale=2; $ours_full / 1000" | bc -l) | $(peak_gb "$work/ours_full.log")")

for name in nanoGPT_fp32 nanoGPT_compile nanoGPT_bf16; do
  if [[ -n ${skip[$name]} ]]; then echo "[bench] skip $name: ${skip[$name]}"; continue; fi
  echo "[bench] $name, CPU preset"
  nano_run "$name" "$name" "${cpu_nano[@]}" || { tail -3 "$work/$name.log"; continue; }
  read -r ms val < <(median nanogpt "$work/$name.log" 10)
  echo "[bench] $name, full preset"
  read -r -a cmd <<<"${runner[$name]}"
  (cd "$work/nanoGPT" && "${rss[@]}" -o "$work/${name}_full.log" "$py" "${cmd[@]}" "${full_nano[@]}" \
     --out_dir="$work/${name}_full" >>"$work/${name}_full.log" 2>&1) || true
  read -r full _ < <(median nanogpt "$work/${name}_full.log" 1)
  rows+=("$name | $ms | $val | $(echo "scale=2; $full / 1000" | bc -l) | $(peak_gb "$work/${name}_full.log")")
done
echo
echo "| run | CPU preset ms/iter | val @ $cpu_iters | full preset s/iter | full preset peak RSS GB |"
echo "|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "| $r |"; done

# The CPU preset again, in CPU_ROUNDS alternating rounds of CPU_ROUND_ITERS iterations (default 3 of
# 300): the runs above are minutes apart, and this host's speed drifts within minutes. Each round
# runs ours, then nanoGPT as it is and with the bf16 patch, back to back; the ratio is against the
# faster of the two. (--compile=True, the slowest of the three on this preset in every run so far,
# would add a minute of compilation a round.)
cpu_round_iters=${CPU_ROUND_ITERS:-300}
cpu_round_args=(--max_iters="$cpu_round_iters" --lr_decay_iters="$cpu_round_iters" --eval_interval="$cpu_round_iters")
cpu_round_rows=()
for round in $(seq "${CPU_ROUNDS:-3}"); do
  echo "[bench] CPU preset, round $round"
  ours_cpu_run ours_cpu_round "${cpu_round_args[@]}"
  read -r ours_round _ < <(median ours "$work/ours_cpu_round.log" 10)
  cpu_round_rows+=("$round | $ours_round$(vs_nanogpt "$ours_round" round 0 "${cpu_nano[@]}" "${cpu_round_args[@]}")")
done
echo
echo "| CPU preset round ($cpu_round_iters iterations) | ours ms/iter | nanoGPT ms/iter | nanoGPT + bf16 patch ms/iter | nanoGPT's faster / ours |"
echo "|---|---|---|---|---|"
for r in "${cpu_round_rows[@]}"; do echo "| $r |"; done

# Tang poems CPU config (V = 7,443): ours alternating with nanoGPT, as it is and + the bf16 patch (its shakespeare_char
# prepare.py reading the poems as UTF-8; the same sizes and schedule), TANG_ROUNDS rounds.
tang_iters=${TANG_ITERS:-300}
tang_rows=()
nanogpt_peer_tang "$work" "$py"
build/nanogpt prepare --input data/tang_poems/input.txt --out_dir data/tang_poems >/dev/null
tang_nano=(config/train_shakespeare_char.py --device=cpu --dataset=tang --n_layer=4 --n_head=4 --n_embd=192
           --block_size=64 --batch_size=16 --dropout=0.0 --max_iters="$tang_iters" --lr_decay_iters="$tang_iters"
           --eval_iters=20 --eval_interval="$tang_iters" --warmup_iters="$warmup" --log_interval=1 --compile=False)
for round in $(seq "${TANG_ROUNDS:-2}"); do
  echo "[bench] Tang poems, round $round"
  build/nanogpt train configs/tang_poems_cpu.yaml --out_dir="$work/ours_tang" --log_interval=1 --max_iters="$tang_iters" \
    --lr_decay_iters="$tang_iters" --eval_interval="$tang_iters" --warmup_iters="$warmup" --num_threads="$threads" \
    >"$work/ours_tang.log" 2>&1 || { tail -3 "$work/ours_tang.log"; exit 1; }
  read -r ours_tang ours_tang_val < <(median ours "$work/ours_tang.log" 10)
  # As the CPU preset's rounds: where the CPU's bf16 products are slower than its fp32 ones (an
  # Intel Xeon without AMX), nanoGPT as it is is its best.
  tang_rows+=("$round | $ours_tang | $ours_tang_val$(vs_nanogpt "$ours_tang" tang 1 "${tang_nano[@]}")")
done

# Sampling, 2,000 new tokens each, as the goal measures (nanoGPT's sample.py recomputes the window for
# every token: ~85 s for the full model in fp32. FULL_SAMPLE_NANO=400 takes a fifth of that but
# flatters it by ~30%: more of its tokens see a short window). The full model's weights are those
# after 1 iteration: speed only. nanoGPT's sample.py runs its CPU forward in a nullcontext, as
# train.py does; sample_bf16.py makes the bf16 patch's one change (autocast in its place) to it.
cat >"$work/sample_bf16.py" <<'PY'
import contextlib, os, runpy, sys
import torch, torch._dynamo  # noqa: F401  (as run_patch.py)
sys.path.insert(0, os.getcwd())  # sample.py imports nanoGPT's model.py
contextlib.nullcontext = lambda *a, **k: torch.autocast("cpu", dtype=torch.bfloat16)
sys.argv = ["sample.py"] + sys.argv[1:]
runpy.run_path("sample.py", run_name="__main__")
PY
(cd "$work/nanoGPT" && "$py" train.py "${full_nano[@]}" --max_iters=1 --compile=False --always_save_checkpoint=True \
   --eval_interval=1 --out_dir="$work/nanoGPT_fp32_full_ckpt" >"$work/nano_full_ckpt.log" 2>&1)
ours_rate() {  # out_dir new_tokens [--dtype=...] -> tok/s, or "-" when it fails
  # Our sample times its own generation (from the prompt's prefill to the last token) and prints
  # the rate: start-up excluded as for nanoGPT below, but without the difference of two runs, whose
  # noise (±0.05 s) swamps the CPU-preset model's ~0.1 s of generation.
  build/nanogpt sample --out_dir="$1" --num_samples=1 --num_threads="$threads" --max_new_tokens="$2" "${@:3}" 2>&1 \
    >/dev/null | sed -n 's/^\[sample\] [0-9]* tokens in .* s: \([0-9]*\) tok\/s.*/\1/p' | grep . ||
    { echo "[bench] our sample ${*:3} of $1 failed" >&2; echo "-"; }
}
nano_rate() {  # script out_dir new_tokens -> tok/s, or "-" when it fails
  local samp=("$1" --out_dir="$2" --device=cpu --num_samples=1 --compile=False --dtype=float32) n=$3 tn t1
  [[ -d $2 ]] || { echo "-"; return 0; }
  tn=$(cd "$work/nanoGPT" && PYTHONPATH=$work/stub seconds "$py" "${samp[@]}" --max_new_tokens="$n") &&
    t1=$(cd "$work/nanoGPT" && PYTHONPATH=$work/stub seconds "$py" "${samp[@]}" --max_new_tokens=1) ||
    { echo "[bench] $1 --out_dir=$2 failed" >&2; echo "-"; return 0; }
  tok_per_s "$n" "$tn" "$t1" 1
}
full_new=${FULL_SAMPLE_TOKENS:-2000}
full_nano_new=${FULL_SAMPLE_NANO:-2000}
auto_dtype=$(build/nanogpt sample --out_dir="$work/ours_cpu" --num_samples=1 --max_new_tokens=1 2>&1 >/dev/null |
  sed -n 's/.*, \([a-z0-9]*\))$/\1/p')
# SAMPLE_ROUNDS rounds (default 3), each running every row once, so that the host's drift reaches
# every row alike; each cell is the median of the rounds, with their range.
declare -A rates=()
labels=("nanogpt-cpp, dtype auto ($auto_dtype)" "nanogpt-cpp, --dtype=float32" "nanoGPT sample.py (fp32)"
        "nanoGPT sample.py + CPU bf16 autocast" "nanogpt-cpp, dtype auto, --quantize=int8 (opt-in)"
        "nanogpt-cpp, dtype auto, --quantize=int4 (opt-in)")
for round in $(seq "${SAMPLE_ROUNDS:-3}"); do
  echo "[bench] sampling, round $round"
  rates[0,small]+=" $(ours_rate "$work/ours_cpu" 2000)"
  rates[0,full]+=" $(ours_rate "$work/ours_full" "$full_new")"
  rates[1,small]+=" $(ours_rate "$work/ours_cpu" 2000 --dtype=float32)"
  rates[1,full]+=" $(ours_rate "$work/ours_full" "$full_new" --dtype=float32)"
  rates[4,small]+=" $(ours_rate "$work/ours_cpu" 2000 --quantize=int8)"
  rates[4,full]+=" $(ours_rate "$work/ours_full" "$full_new" --quantize=int8)"
  rates[5,small]+=" $(ours_rate "$work/ours_cpu" 2000 --quantize=int4)"
  rates[5,full]+=" $(ours_rate "$work/ours_full" "$full_new" --quantize=int4)"
  for i in 2 3; do
    script=sample.py
    [[ $i == 3 ]] && script=$work/sample_bf16.py
    rates[$i,small]+=" $(nano_rate "$script" "$work/nanoGPT_fp32" 2000)"
    rates[$i,full]+=" $(nano_rate "$script" "$work/nanoGPT_fp32_full_ckpt" "$full_nano_new")"
  done
done
summary() {  # "r1 r2 ..." -> "median (min–max)", "-" if any round failed
  [[ $1 == *-* ]] && { echo "-"; return 0; }
  printf '%s\n' $1 | sort -g | awk '{ v[NR] = $1 } END { printf "%s (%s–%s)", v[int((NR + 1) / 2)], v[1], v[NR] }'
}
sample_rows=()
for i in 0 1 2 3 4 5; do sample_rows+=("${labels[$i]} | $(summary "${rates[$i,small]}") | $(summary "${rates[$i,full]}")"); done
# Within each round, ours against nanoGPT's faster variant of that round: the host's drift between
# rounds (up to 2x) cancels here, not in the medians above.
round_ratios() {  # model (small|full) row -> "r1, r2, ..." (x), "-" where a rate is missing
  local model=$1 row=$2 ours nano_fp32 nano_bf16 i out=()
  read -ra ours <<<"${rates[$row,$model]}"
  read -ra nano_fp32 <<<"${rates[2,$model]}"
  read -ra nano_bf16 <<<"${rates[3,$model]}"
  for i in "${!ours[@]}"; do
    out+=("$(awk -v o="${ours[$i]}" -v a="${nano_fp32[$i]:--}" -v b="${nano_bf16[$i]:--}" 'BEGIN {
      best = (a == "-" ? 0 : a + 0); if (b != "-" && b + 0 > best) best = b + 0
      if (o == "-" || best <= 0) print "-"; else printf "%.0f", o / best }')")
  done
  local IFS=,
  echo "${out[*]}" | sed 's/,/, /g'
}
ratio_rows=()
for i in 0 4 5; do ratio_rows+=("${labels[$i]} | $(round_ratios small $i) | $(round_ratios full $i)"); done

# Start-up on its own, the median of 5 runs each: a sample of 1 token (the CPU-preset model, then the
# full preset's with 43 MB of weights to read) from process start to its first output (the sample is
# printed once its token is drawn) and to the end of the process, and under it the floor of each
# runtime: our program with LibTorch loaded and nothing else (its --version), and Python importing torch.
startup() {  # command... -> "first output s | whole run s", medians of 5
  "$py" - "$@" <<'PY'
import statistics, subprocess, sys, time
first, whole = [], []
for _ in range(5):
    t0 = time.perf_counter()
    p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    got = p.stdout.read(1)
    t1 = time.perf_counter()
    p.stdout.read()
    rc = p.wait()
    if rc != 0:
        print("- | -")
        sys.exit(0)
    first.append(t1 - t0 if got else float("nan"))
    whole.append(time.perf_counter() - t0)
print(f"{statistics.median(first):.3f} | {statistics.median(whole):.3f}")
PY
}
startup_rows=("nanogpt-cpp: sample, 1 token | $(startup build/nanogpt sample --out_dir="$work/ours_cpu" --num_samples=1 \
  --max_new_tokens=1 --num_threads="$threads")")
[[ -d $work/ours_full ]] && startup_rows+=("nanogpt-cpp: sample, 1 token, full-preset model | $(startup build/nanogpt sample \
  --out_dir="$work/ours_full" --num_samples=1 --max_new_tokens=1 --num_threads="$threads")")
startup_rows+=("nanogpt-cpp: --version (LibTorch loaded, nothing else) | $(startup build/nanogpt --version)")
[[ -d $work/nanoGPT_fp32 ]] && startup_rows+=("nanoGPT: sample.py, 1 token | $(cd "$work/nanoGPT" && PYTHONPATH=$work/stub \
  startup "$py" sample.py --out_dir="$work/nanoGPT_fp32" --device=cpu --num_samples=1 --compile=False --dtype=float32 \
  --max_new_tokens=1)")
startup_rows+=("Python: import torch, print() | $(startup "$py" -c 'import torch; print()')")

echo
echo "| Tang round | ours ms/iter | ours val @ $tang_iters | nanoGPT ms/iter | its val | nanoGPT + bf16 patch ms/iter | its val | nanoGPT's faster / ours |"
echo "|---|---|---|---|---|---|---|---|"
for r in "${tang_rows[@]}"; do echo "| $r |"; done
echo
echo "| sampling, start-up excluded, median of ${SAMPLE_ROUNDS:-3} rounds (range) | CPU-preset model tok/s (2000 new) | full-preset model tok/s ($full_new new; nanoGPT $full_nano_new) |"
echo "|---|---|---|"
for r in "${sample_rows[@]}"; do echo "| $r |"; done
echo
echo "| sampling, ours / nanoGPT's faster variant, each round | CPU-preset model (x) | full-preset model (x) |"
echo "|---|---|---|"
for r in "${ratio_rows[@]}"; do echo "| $r |"; done
echo
echo "| start-up, median of 5 | to the first output, s | whole run, s |"
echo "|---|---|---|"
for r in "${startup_rows[@]}"; do echo "| $r |"; done
