#!/usr/bin/env bash
# Builds the unit tests and the nanogpt program with AddressSanitizer + UndefinedBehaviorSanitizer
# (-DNANOGPT_SANITIZE=ON, g++ by default) in build-asan, and runs the whole suite through ctest.
#
#   scripts/sanitize.sh [--build-only | --test-only] [extra ctest args, e.g. -R Checkpoint]
#   env: BUILD_DIR (default build-asan), JOBS (build and ctest parallelism, default 2)
#
# Any ASan or UBSan report fails the test that triggers it (halt_on_error, -fno-sanitize-recover).
# Settings, and why:
#   detect_leaks=1 with tests/sanitizers/lsan.supp: fontconfig's process-wide font caches (built
#     when pango first lays out text for a figure) are suppressed; see the file.
#   allocator_may_return_null=1: a failed allocation returns null as glibc's malloc does, so
#     LibTorch throws its out-of-memory error (which our code turns into one line, and a test
#     provokes) instead of ASan aborting the process.
#   No ODR or container-overflow exceptions are needed: LibTorch is not instrumented, so ASan has
#     nothing of it to compare. UBSan's vptr checks stay on (our modules derive from LibTorch's).
# With 2 cores: ~20-30 min to build from scratch, 5-7 min to test (2026-12-03: 318 and 419 s).
# The normal build: ~12 min, its tests ~3 min.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-asan}
[[ $BUILD = /* ]] || BUILD=$ROOT/$BUILD
JOBS=${JOBS:-2}
do_build=1 do_test=1
case ${1:-} in
  --build-only) do_test=0; shift ;;
  --test-only) do_build=0; shift ;;
esac

if ((do_build)); then
  start=$(date +%s)
  # LibTorch from scripts/setup.sh's environment, as scripts/build.sh finds it (else CMAKE_PREFIX_PATH).
  source "$ROOT/scripts/env.sh"
  nanogpt_find_torch || true
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DNANOGPT_SANITIZE=ON -DNANOGPT_BUILD_TESTS=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "${NANOGPT_TORCH_ARGS[@]}" >/dev/null
  cmake --build "$BUILD" -j "$JOBS"
  echo "[sanitize] build: $(($(date +%s) - start)) s"
fi

if ((do_test)); then
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1:halt_on_error=1:allocator_may_return_null=1}
  export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$ROOT/tests/sanitizers/lsan.supp:print_suppressions=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$ROOT/tests/sanitizers/ubsan.supp}
  start=$(date +%s)
  set +e
  (cd "$BUILD" && ctest --output-on-failure -j "$JOBS" "$@")
  rc=$?
  set -e
  echo "[sanitize] tests: $(($(date +%s) - start)) s, ctest exit $rc"
  exit $rc
fi
