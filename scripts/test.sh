#!/usr/bin/env bash
# The README's test command: set up, build, run the whole suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DNANOGPT_BUILD_TESTS=ON
cd build
ctest --output-on-failure -j"$(nproc)" --timeout 600
