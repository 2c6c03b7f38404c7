#!/usr/bin/env bash
# Runs one libFuzzer target for a given time, on one core, with its growing corpus.
#
#   scripts/fuzz.sh TARGET SECONDS [extra libFuzzer flags...]
#   TARGET: vocab | config | data_files | safetensors | checkpoint   (see tests/fuzz/CMakeLists.txt)
#   env: BUILD_DIR (default build-fuzz), JOBS (build parallelism, default 2)
#
# Builds (CC=clang-14 CXX=clang++-14, -DNANOGPT_FUZZ=ON) when needed. The corpus lives in
# $BUILD_DIR/corpus/TARGET (git-ignored) and is seeded from the fuzz_seeds program (valid files
# written by the project's own writers) and tests/fuzz/seeds/TARGET (past findings, kept as
# regressions; their unit tests are in tests/test_robustness.cpp). Findings (crash-*,
# timeout-*, oom-*) go to $BUILD_DIR/findings/TARGET; reproduce one with
#   $BUILD_DIR/tests/fuzz/fuzz_TARGET $BUILD_DIR/findings/TARGET/crash-...
# The full log is $BUILD_DIR/fuzz_logs/TARGET.log; the last lines give executions and coverage.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
if (($# < 2)); then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
TARGET=$1
SECONDS_TO_RUN=$2
shift 2
case $TARGET in
  vocab | config | data_files | safetensors | checkpoint) ;;
  *) echo "fuzz.sh: unknown target '$TARGET' (vocab, config, data_files, safetensors, checkpoint)" >&2; exit 2 ;;
esac
BUILD=${BUILD_DIR:-$ROOT/build-fuzz}
[[ $BUILD = /* ]] || BUILD=$ROOT/$BUILD

if [[ ! -f $BUILD/CMakeCache.txt ]]; then
  # LibTorch from scripts/setup.sh's environment, as scripts/build.sh finds it (else CMAKE_PREFIX_PATH).
  source "$ROOT/scripts/env.sh"
  nanogpt_find_torch || true
  CC=${CC:-clang-14} CXX=${CXX:-clang++-14} cmake -S "$ROOT" -B "$BUILD" -G Ninja -DNANOGPT_FUZZ=ON \
    -DNANOGPT_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo "${NANOGPT_TORCH_ARGS[@]}" >/dev/null
fi
cmake --build "$BUILD" --target "fuzz_$TARGET" fuzz_seeds -j "${JOBS:-2}" | grep -v '^ninja: no work to do' || true
FUZZER=$BUILD/tests/fuzz/fuzz_$TARGET

# Sanitizer settings: abort on the first report (libFuzzer saves the input), symbolized traces.
# Leak checking stays on, minus the library leaks in tests/sanitizers/lsan.supp (each with its reason).
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:symbolize=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$ROOT/tests/sanitizers/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

CORPUS=$BUILD/corpus/$TARGET
FINDINGS=$BUILD/findings/$TARGET
LOGS=$BUILD/fuzz_logs
# Each run writes the seeds in a folder of its own: two targets fuzzed at once (one per core) must
# not share fuzz_seeds' scratch files.
SEEDS=$BUILD/seeds/$TARGET.run
mkdir -p "$CORPUS" "$FINDINGS" "$LOGS" "$SEEDS"
"$BUILD/tests/fuzz/fuzz_seeds" "$SEEDS"
cp -n "$SEEDS/$TARGET"/* "$CORPUS"/ 2>/dev/null || true
if [[ -d $ROOT/tests/fuzz/seeds/$TARGET ]]; then cp -n "$ROOT/tests/fuzz/seeds/$TARGET"/* "$CORPUS"/ 2>/dev/null || true; fi
if [[ $TARGET == config ]]; then
  for f in "$ROOT"/configs/*.yaml; do cp -n "$f" "$CORPUS/seed_$(basename "$f")"; done
fi
DICT=()
if [[ -f $ROOT/tests/fuzz/$TARGET.dict ]]; then DICT=(-dict="$ROOT/tests/fuzz/$TARGET.dict"); fi

LOG=$LOGS/$TARGET.log
echo "[fuzz] fuzz_$TARGET for $SECONDS_TO_RUN s, corpus $CORPUS ($(ls "$CORPUS" | wc -l) files), log $LOG"
set +e
# One process, one core (no -jobs/-workers). -timeout: an input taking 10 s is a finding;
# -rss_limit_mb: so is a runaway allocation (a corrupt size field must never allocate gigabytes).
"$FUZZER" "$CORPUS" -max_total_time="$SECONDS_TO_RUN" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$FINDINGS/" "${DICT[@]}" "$@" >"$LOG" 2>&1
rc=$?
set -e
last=$(grep -E '^#[0-9]+' "$LOG" | tail -1 || true)
execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$LOG" | grep -o '[0-9]*$' || echo '?')
echo "[fuzz] $TARGET: exit $rc, $execs executions; last status: $last"
echo "[fuzz] corpus now $(ls "$CORPUS" | wc -l) files, $(du -sh "$CORPUS" | cut -f1)"
if ((rc != 0)); then
  echo "[fuzz] FINDING (see $LOG):"
  grep -E 'ERROR|FUZZ FINDING|SUMMARY|Test unit written' "$LOG" | head -10
fi
exit $rc
