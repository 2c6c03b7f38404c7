#!/usr/bin/env bash
# The hand-written loops' AVX2 builds use AVX2's 256-bit registers: for every kernel built by
# simd.h's NANOGPT_KERNEL (a `NAME_clones` beside a `NAME_avx2`), the code of NAME_avx2 (with GCC's
# .part/.isra/.cold pieces of it) holds at least one ymm instruction. A loop GCC leaves scalar, or a
# body that calls an out-of-line helper built for the baseline, has none: it fails here, named.
# Exempt: matvec_rows_int4_portable (a CPU with AVX2 and FMA runs the int4 intrinsics kernel, never
# that loop's AVX2 build).
#   tests/kernels_vectorised.sh OBJDUMP OBJECT...   (ctest: KernelsVectoriseForAvx2)
set -euo pipefail
objdump=${1:?usage: tests/kernels_vectorised.sh OBJDUMP OBJECT...}
shift
(($# > 0)) || { echo "no objects given" >&2; exit 2; }
"$objdump" -d --no-show-raw-insn -C "$@" | awk '
  # A symbol line: "0000000000001a6b0 <ns::(anonymous namespace)::name_avx2(args) [clone .part.0]>:"
  /^[0-9a-f]+ <.*>:$/ {
    current = ""
    line = $0
    sub(/^[0-9a-f]+ </, "", line)
    gsub(/\(anonymous namespace\)/, "anon", line)
    sub(/\(.*$/, "", line)          # the name without its arguments
    sub(/^.*::/, "", line)          # nor its namespaces
    sub(/^.* /, "", line)           # nor a template return type ("void name<...>")
    sub(/<.*$/, "", line)           # nor template arguments
    if (line ~ /_avx2$/) { base = substr(line, 1, length(line) - 5); avx2[base] += 0; current = base }
    else if (line ~ /_clones$/) { clones[substr(line, 1, length(line) - 7)] = 1 }
    next
  }
  current != "" && /ymm/ { avx2[current]++ }
  END {
    checked = 0; bad = 0
    for (base in avx2) {
      if (!(base in clones) || base == "matvec_rows_int4_portable") continue
      checked++
      if (avx2[base] == 0) { print "not vectorised for AVX2: " base "_avx2 (no ymm instruction)"; bad++ }
    }
    if (checked == 0) { print "no NANOGPT_KERNEL twins found in the objects"; exit 1 }
    if (bad > 0) exit 1
    print checked " kernels: each AVX2 build uses ymm registers"
  }'
