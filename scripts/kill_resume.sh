#!/usr/bin/env bash
# Crash-safety check for `nanogpt train`: kill -9 at random moments, resume, repeat; then Ctrl-C
# (SIGINT) and SIGTERM; then a full disk while saving. Builds nothing: give it a nanogpt binary.
#
#   scripts/kill_resume.sh [NANOGPT_BINARY] [KILLS]     (defaults: build/nanogpt 20)
#   env: SEED=N (reproducible kill times), KEEP=1 (keep the work folder), NO_DISK_FULL=1,
#        NO_TMPFS=1 (simulate the full disk with `ulimit -f` even as root),
#        CHECKPOINT_INTERVAL=N (also save every N iterations between evaluations; default 2),
#        ASYNC=false (save on the training thread instead of in the background: checkpoint_async)
#
# A tiny model (2 layers, 32 wide, block 32) trains 200 iterations on a private copy of
# data/shakespeare_char, evaluating and checkpointing every 10 and saving ckpt_last every
# CHECKPOINT_INTERVAL between them: a save is being written much of the time, so many kills land
# in the middle of one. Checked, with the summary at the end:
#  - after every kill: each checkpoint present loads (`nanogpt sample` on it succeeds) and the next
#    run resumes from it (from scratch when the kill came before the first checkpoint), at an
#    iteration >= the last one any run reported saving; leftover *.tmp.* files belong to killed
#    processes only (a run that exits normally leaves none), and each one left by a kill counts
#    that kill as one that landed mid-write;
#  - the final run reaches max_iters, and metrics.csv matches an uninterrupted reference run row
#    for row (iter, split, loss, lr): resume is exact, and no row is lost or repeated;
#  - SIGINT / SIGTERM: exit 130 / 143, a checkpoint at the iteration the log reports, and a resume
#    from exactly there that again matches the reference;
#  - disk full while saving (a small tmpfs when this runs as root, else `ulimit -f`): one clear
#    error line, a non-zero exit, the previous checkpoints byte-identical, no temp file left.
# Exits non-zero on any failure.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/build/nanogpt}
KILLS=${2:-20}
[[ $BIN = /* ]] || BIN=$PWD/$BIN
if [[ ! -x $BIN ]]; then
  echo "[kill_resume] no nanogpt binary at '$BIN' (build it first: cmake --build build --target nanogpt)" >&2
  exit 2
fi
if [[ -n ${SEED:-} ]]; then RANDOM=$SEED; fi
CHECKPOINT_INTERVAL=${CHECKPOINT_INTERVAL:-2}
ASYNC=${ASYNC:-true}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/nanogpt_kill_resume.XXXXXX")
MOUNTED=""
cleanup() {
  [[ -n $MOUNTED ]] && umount "$MOUNTED" 2>/dev/null
  if [[ -n ${KEEP:-} ]]; then echo "[kill_resume] kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

FAILURES=0
say() { echo "[kill_resume] $*"; }
fail() {
  echo "[kill_resume] FAIL: $*"
  FAILURES=$((FAILURES + 1))
}

MAX_ITERS=200
write_config() {  # write_config FILE OUT_DIR DATASET
  cat >"$1" <<EOF
out_dir: $2
dataset: $3
n_layer: 2
n_head: 2
n_embd: 32
block_size: 32
batch_size: 4
max_iters: $MAX_ITERS
lr_decay_iters: $MAX_ITERS
warmup_iters: 10
eval_interval: 10
checkpoint_interval: $CHECKPOINT_INTERVAL
checkpoint_async: $ASYNC
eval_iters: 2
log_interval: 1
dtype: float32
device: cpu
num_threads: 1
plot: false
EOF
}

# The rows that must not depend on interruptions: iter, split, loss, lr (not timings).
metric_rows() { tail -n +2 "$1" | cut -d, -f1-4; }

# Every checkpoint in $1 must load for sampling.
check_loadable() {
  local dir=$1 what=$2 ckpt
  for ckpt in "$dir"/ckpt_last.safetensors "$dir"/ckpt_best.safetensors; do
    [[ -e $ckpt ]] || continue
    if ! "$BIN" sample --ckpt="$ckpt" --max_new_tokens=5 --num_samples=1 --device=cpu --num_threads=1 \
      >"$WORK/sample.out" 2>"$WORK/sample.err"; then
      fail "$what: $(basename "$ckpt") does not load: $(tail -1 "$WORK/sample.err")"
    fi
  done
}

# Leftover temp files in the given folders: allowed only from processes that were killed. Sets
# TMP_COUNT (not echoed: fail() must run in this shell, not in a $(...) subshell).
ORPHAN_PIDS=" "
TMP_COUNT=0
count_tmp_files() {
  local n=0 dir f pid
  for dir in "$@"; do for f in "$dir"/*.tmp.*; do
    [[ -e $f ]] || continue
    pid=${f##*.tmp.}
    pid=${pid%%.*}
    if kill -0 "$pid" 2>/dev/null; then
      fail "temp file $(basename "$f") belongs to a live process $pid"
    elif [[ $ORPHAN_PIDS != *" $pid "* ]]; then
      fail "temp file $(basename "$f") was left by process $pid, which was not killed"
    fi
    n=$((n + 1))
  done; done
  TMP_COUNT=$n
}

last_saved_iter() {  # the last "[ckpt] saved .../ckpt_last.safetensors (iter N, T ms)" in a run's output, or -1
  grep -o 'ckpt_last.safetensors (iter [0-9]*' "$1" | tail -1 | grep -o '[0-9]*$' || true
}

# --- 1. an uninterrupted reference run -----------------------------------------------------------
mkdir -p "$WORK/ref_data" "$WORK/data"
cp "$ROOT/data/shakespeare_char/input.txt" "$WORK/ref_data/"
cp "$ROOT/data/shakespeare_char/input.txt" "$WORK/data/"
write_config "$WORK/ref.yaml" "$WORK/ref" "$WORK/ref_data"
write_config "$WORK/train.yaml" "$WORK/out" "$WORK/data"
START=$(date +%s.%N)
if ! "$BIN" train "$WORK/ref.yaml" >"$WORK/ref.log" 2>&1; then
  say "the reference run failed:"
  tail -5 "$WORK/ref.log"
  exit 1
fi
RUN_MS=$(awk -v s="$START" -v e="$(date +%s.%N)" 'BEGIN { printf "%d", (e - s) * 1000 }')
say "reference run: $MAX_ITERS iterations in ${RUN_MS} ms (saves every $CHECKPOINT_INTERVAL, checkpoint_async: $ASYNC);" \
  "kills land at random in 0..${RUN_MS} ms"
metric_rows "$WORK/ref/metrics.csv" >"$WORK/ref_rows.csv"

# --- 2. kill -9 at random moments, resume each time ---------------------------------------------
OUT=$WORK/out
kills=0 runs=0 scratch_starts=0 finished_early=0 max_saved=-1 resumes=0 max_orphans=0 mid_write=0
while ((kills < KILLS)); do
  runs=$((runs + 1))
  log=$WORK/run_$runs.log
  if [[ -e $OUT/ckpt_last.safetensors ]]; then
    mode=resume
    "$BIN" train "$WORK/train.yaml" --init_from=resume >"$log" 2>&1 &
  else
    mode=scratch
    scratch_starts=$((scratch_starts + 1))
    "$BIN" train "$WORK/train.yaml" >"$log" 2>&1 &
  fi
  pid=$!
  delay_ms=$(((RANDOM * 32768 + RANDOM) % (RUN_MS + 1)))
  sleep "$(awk -v ms="$delay_ms" 'BEGIN { printf "%.3f", ms / 1000 }')"
  if kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    rc=$?
    kills=$((kills + 1))
    ORPHAN_PIDS+="$pid "
    what="kill $kills/$KILLS ($mode run, after ${delay_ms} ms)"
    if compgen -G "$OUT/ckpt_*.tmp.$pid.*" >/dev/null; then
      mid_write=$((mid_write + 1))
      what+=" mid-write"
    fi
  else
    wait "$pid"
    rc=$?
    what="run $runs ($mode) ended before its kill"
    if ((rc != 0)); then fail "$what with exit $rc: $(tail -1 "$log")"; fi
  fi
  # A resumed run must start at or after the last checkpoint any run reported as saved.
  if [[ $mode == resume ]]; then
    resumed=$(grep -o 'resumed from .* at iter [0-9]*' "$log" | grep -o '[0-9]*$' || true)
    if [[ -n $resumed ]]; then
      resumes=$((resumes + 1))
      ((resumed >= max_saved)) || fail "$what: resumed at iter $resumed, but iter $max_saved had been saved"
    elif grep -q '^error' "$log"; then
      fail "$what: the resume failed: $(grep '^error' "$log" | head -1)"
    fi
  fi
  saved=$(last_saved_iter "$log")
  [[ -n $saved ]] && ((saved > max_saved)) && max_saved=$saved
  check_loadable "$OUT" "$what"
  count_tmp_files "$OUT" "$WORK/data"
  orphans=$TMP_COUNT
  ((orphans > max_orphans)) && max_orphans=$orphans
  iter_now=$(grep -o 'ckpt_last.safetensors (iter [0-9]*' "$log" | tail -1)
  [[ -n $iter_now ]] && iter_now+=")"
  say "$what: exit $rc; ${iter_now:-no checkpoint saved in this run}; temp files left: $orphans"
  if ((rc == 0)) && grep -q "done at iter $MAX_ITERS" "$log"; then
    finished_early=$((finished_early + 1))
    say "training finished before a kill: starting over from scratch"
    rm -rf "$OUT"
    max_saved=-1
  fi
done

# --- 3. let it finish ----------------------------------------------------------------------------
log=$WORK/final.log
if [[ -e $OUT/ckpt_last.safetensors ]]; then
  "$BIN" train "$WORK/train.yaml" --init_from=resume >"$log" 2>&1
else
  "$BIN" train "$WORK/train.yaml" >"$log" 2>&1
fi
rc=$?
final_iter=$(grep -o 'done at iter [0-9]*' "$log" | grep -o '[0-9]*$' || true)
if ((rc != 0)) || [[ $final_iter != "$MAX_ITERS" ]]; then
  fail "the final run ended with exit $rc at iter '${final_iter:-?}' (expected $MAX_ITERS): $(tail -1 "$log")"
fi
check_loadable "$OUT" "after the final run"
if ! metric_rows "$OUT/metrics.csv" | cmp -s - "$WORK/ref_rows.csv"; then
  fail "metrics.csv after $kills kills differs from the uninterrupted run (first difference below)"
  metric_rows "$OUT/metrics.csv" | diff - "$WORK/ref_rows.csv" | head -6
else
  say "after $kills kills: final iter $final_iter, metrics.csv identical to the uninterrupted run ($(wc -l <"$WORK/ref_rows.csv") rows)"
fi
count_tmp_files "$OUT" "$WORK/data"
leftover=$TMP_COUNT

# --- 4. SIGINT and SIGTERM: save, exit 128 + signal, resume from exactly there -----------------
signal_check() {  # signal_check NAME EXPECTED_RC
  local sig=$1 expect=$2 dir=$WORK/$1 log=$WORK/$1.log rc stop_rc n stopped saved resumed
  write_config "$WORK/$sig.yaml" "$dir" "$WORK/data"
  "$BIN" train "$WORK/$sig.yaml" >"$log" 2>&1 &
  local pid=$!
  for ((n = 0; n < 600; ++n)); do  # until training is under way (iter >= 30), at most 60 s
    grep -qs '^\[train\] iter [3-9][0-9] ' "$log" && break  # -s: the log may not exist yet
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  sleep "0.0$((RANDOM % 10))"
  kill -s "$sig" "$pid" 2>/dev/null
  wait "$pid"
  stop_rc=$?
  stopped=$(grep -o 'stopping at iter [0-9]*' "$log" | grep -o '[0-9]*$' || true)
  saved=$(last_saved_iter "$log")
  if ((stop_rc != expect)); then fail "$sig: exit $stop_rc, expected $expect ($(tail -1 "$log"))"; fi
  if [[ -z $stopped || $saved != "$stopped" ]]; then
    fail "$sig: the log reports stopping at iter '${stopped:-?}' but the last save was iter '${saved:-?}'"
  fi
  check_loadable "$dir" "$sig"
  "$BIN" train "$WORK/$sig.yaml" --init_from=resume >"$log.resume" 2>&1
  rc=$?
  resumed=$(grep -o 'resumed from .* at iter [0-9]*' "$log.resume" | grep -o '[0-9]*$' || true)
  if ((rc != 0)) || [[ $resumed != "$stopped" ]]; then
    fail "$sig: resume exit $rc at iter '${resumed:-?}', expected iter $stopped: $(tail -1 "$log.resume")"
  elif ! metric_rows "$dir/metrics.csv" | cmp -s - "$WORK/ref_rows.csv"; then
    fail "$sig: metrics.csv after stop + resume differs from the uninterrupted run"
  else
    say "SIG$sig: exit $stop_rc, stopped and saved at iter $stopped; checkpoint loads; resumed at iter $resumed;" \
      "metrics identical to the uninterrupted run"
  fi
  count_tmp_files "$dir"
  ((TMP_COUNT == 0)) || fail "$sig: temp files left in $dir"
}
signal_check INT 130
signal_check TERM 143

# --- 5. disk full while saving -------------------------------------------------------------------
# A run trains to iter 20 on a normal disk; its out_dir is then copied onto a file system with
# room for the logs but not for another checkpoint, and resumed: the save at iter 30 must fail.
disk_full_check() {
  local src=$WORK/full_src dir log=$WORK/full.log rc errors method sums_before sums_after
  write_config "$WORK/full.yaml" "$src" "$WORK/data"
  "$BIN" train "$WORK/full.yaml" --max_iters=20 >"$WORK/full_src.log" 2>&1 || {
    fail "disk full: the preparing run failed: $(tail -1 "$WORK/full_src.log")"
    return
  }
  local ckpt_kb=$(($(stat -c %s "$src/ckpt_last.safetensors") / 1024 + 1))
  local used_kb=$(du -sk "$src" | cut -f1)
  if [[ -z ${NO_TMPFS:-} ]] && mkdir -p "$WORK/tmpfs" && mount -t tmpfs -o size=$((used_kb + ckpt_kb / 2))k tmpfs "$WORK/tmpfs" 2>/dev/null; then
    MOUNTED=$WORK/tmpfs
    method="a $((used_kb + ckpt_kb / 2)) KiB tmpfs (ENOSPC)"
    dir=$WORK/tmpfs/out
    cp -a "$src" "$dir"
    write_config "$WORK/full.yaml" "$dir" "$WORK/data"
    "$BIN" train "$WORK/full.yaml" --init_from=resume >"$log" 2>"$log.err"
    rc=$?
  else
    method="ulimit -f $((ckpt_kb / 2)) KiB (EFBIG)"
    dir=$src
    (trap '' XFSZ && ulimit -f $((ckpt_kb / 2)) && exec "$BIN" train "$WORK/full.yaml" --init_from=resume) >"$log" 2>"$log.err"
    rc=$?
  fi
  sums_before=$(cd "$src" && sha256sum ckpt_last.safetensors ckpt_best.safetensors)
  sums_after=$(cd "$dir" && sha256sum ckpt_last.safetensors ckpt_best.safetensors)
  errors=$(grep -c . "$log.err")
  if ((rc == 0)); then
    fail "disk full ($method): the run exited 0"
  elif ((errors != 1)) || ! grep -q '^error: \[ckpt\] cannot write .*ckpt_last.safetensors' "$log.err"; then
    fail "disk full ($method): expected one 'error: [ckpt] cannot write ...' line, got $errors:"
    head -5 "$log.err"
  elif [[ $sums_before != "$sums_after" ]]; then
    fail "disk full ($method): the previous checkpoints changed"
  else
    say "disk full ($method): exit $rc, checkpoints from iter 20 intact, message: $(cut -c1-150 "$log.err")"
  fi
  check_loadable "$dir" "disk full"
  local tmp
  tmp=$(find "$dir" -name '*.tmp.*' | wc -l)
  ((tmp == 0)) || fail "disk full ($method): $tmp temp file(s) left behind"
  if [[ -n $MOUNTED ]]; then
    umount "$MOUNTED" && MOUNTED=""
  fi
}
if [[ -z ${NO_DISK_FULL:-} ]]; then disk_full_check; fi

# --- summary -------------------------------------------------------------------------------------
say "summary: $kills kills over $runs runs ($resumes resumed, $scratch_starts from scratch, $finished_early finished" \
  "before their kill), $mid_write of the kills in the middle of a checkpoint write; checkpoints loaded after every" \
  "kill; at most $max_orphans orphaned temp file(s) from killed runs at once, $leftover at the end"
if ((FAILURES > 0)); then
  say "FAILED: $FAILURES check(s)"
  exit 1
fi
say "OK"
