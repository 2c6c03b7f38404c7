#!/usr/bin/env bash
# The README's test command: set up, build, run the whole suite through ctest. Its last lines name
# the tests that skipped, by suite, with the first one's reason (a missing tool, no GPU): "100% tests
# passed" counts a skipped test as passed. The exit status is ctest's.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
scripts/build.sh -DNANOGPT_BUILD_TESTS=ON
cd build
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
ctest --output-on-failure -j"$(nproc)" --timeout 600 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# ctest's summary lists them ("  12 - Suite.Name (Skipped)"); Testing/Temporary/LastTest.log holds
# each test's output, where GoogleTest's skip prints "file:line: Skipped" and then the reason.
awk -v last_test=Testing/Temporary/LastTest.log '
  BEGIN {
    while ((getline line < last_test) > 0) {
      if (match(line, /^[0-9]+\/[0-9]+ Test: /)) test = substr(line, RLENGTH + 1)
      else if (line ~ /: Skipped$/ && (getline why < last_test) > 0 && !(test in reason)) reason[test] = why
    }
  }
  /^The following tests did not run:/ { listing = 1; next }
  listing && match($0, /^[ \t]*[0-9]+ - [^ ]+ \((Skipped|Disabled)\)/) {
    name = $3
    suite = name; sub(/\.[^.]*$/, "", suite)
    if (!(suite in count)) { order[++suites] = suite; first[suite] = name }
    count[suite]++; total++
    next
  }
  listing && !/^[ \t]*[0-9]+ - / { listing = 0 }
  END {
    if (!total) { print "[test] no test skipped"; exit }
    printf "[test] %d test%s skipped:\n", total, (total > 1 ? "s" : "")
    for (i = 1; i <= suites; ++i) {
      s = order[i]
      why = first[s] in reason ? reason[first[s]] : ""
      printf "[test]   %s: %d%s\n", s, count[s], why != "" ? " (" why ")" : ""
    }
  }' "$log"
exit "$status"
