#!/usr/bin/env bash
# Proves that the README's two commands work on a machine without the CUDA toolkit, as a fresh
# machine would run them: in a private mount namespace every CUDA toolkit folder is hidden under an
# empty tmpfs, and a fresh clone of the current commit, in an empty temporary folder, runs the
# README's test command (scripts/test.sh: set-up, build, the whole suite). Passes when the build
# configures CPU only, says once why the CUDA plugin is skipped, does not build it, and the suite
# passes. Needs root (or unprivileged user namespaces) for the mount namespace; takes as long as a
# first build plus the suite. Uncommitted changes are not part of the check.
#   scripts/check_no_cuda.sh            (the log is kept in the temporary folder, named at the end)
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z ${NANOGPT_CUDA_HIDDEN:-} ]]; then
  unshare_args=(-m)
  [[ $(id -u) -eq 0 ]] || unshare_args=(-r -m)
  exec unshare "${unshare_args[@]}" env NANOGPT_CUDA_HIDDEN=1 bash "$0" "$@"
fi

# The toolkit's real folders: /usr/local/cuda*, /opt/cuda*, and the one the nvcc on PATH (or its
# wrapper script) runs from.
roots=()
for d in /usr/local/cuda* /opt/cuda* /usr/lib/cuda; do
  [[ -d $d ]] && roots+=("$(readlink -f "$d")")
done
if nvcc_path=$(command -v nvcc); then
  nvcc_real=$(readlink -f "$nvcc_path")
  if head -c 2 "$nvcc_real" | grep -q '#!'; then  # a wrapper: the path it runs
    nvcc_real=$(grep -o '/[^ "]*/bin/nvcc' "$nvcc_real" | head -n 1 || true)
  fi
  [[ -n $nvcc_real && -d $(dirname "$(dirname "$nvcc_real")") ]] && roots+=("$(dirname "$(dirname "$nvcc_real")")")
fi
for root in $(printf '%s\n' "${roots[@]}" | sort -u); do
  case $root in /|/usr|/usr/local|/opt) continue ;; esac  # a toolkit spread over a system folder: see below
  mount -t tmpfs none "$root"
  echo "[check_no_cuda] hid $root"
done
if nvcc --version >/dev/null 2>&1 || [[ -e /usr/local/cuda/include/cuda_runtime_api.h ]] ||
   [[ -e /usr/include/cuda_runtime_api.h ]]; then
  echo "[check_no_cuda] error: a CUDA toolkit is still visible (nvcc runs, or CUDA's headers are in a system folder): cannot hide it here" >&2
  exit 1
fi

commit=$(git rev-parse HEAD)
[[ -z $(git status --porcelain --untracked-files=no) ]] ||
  echo "[check_no_cuda] note: uncommitted changes are not checked (the clone is of $commit)"
work=$(mktemp -d "${TMPDIR:-/tmp}/nanogpt-no-cuda.XXXXXX")
git clone -q --no-checkout "$(git rev-parse --path-format=absolute --git-common-dir)" "$work/nanogpt-cpp"
git -C "$work/nanogpt-cpp" checkout -q --detach "$commit"
log=$work/test.log
echo "[check_no_cuda] $commit in $work/nanogpt-cpp: bash scripts/test.sh (log: $log)"
start=$(date +%s)
set +e
(cd "$work/nanogpt-cpp" && bash scripts/test.sh) >"$log" 2>&1
rc=$?
set -e
elapsed=$(($(date +%s) - start))
tail -n 5 "$log"
fail=()
((rc == 0)) || fail+=("scripts/test.sh exited $rc")
skipped=$(grep -c "nanogpt: CPU only, without the CUDA plugin" "$log" || true)
((skipped == 1)) || fail+=("the configure line saying why the CUDA plugin is skipped appeared $skipped times, not once")
[[ ! -e $work/nanogpt-cpp/build/libnanogpt_cuda.so ]] || fail+=("the CUDA plugin was built")
printf '[check_no_cuda] %s in %d min %d s\n' "$( ((${#fail[@]})) && echo FAILED || echo passed)" $((elapsed / 60)) $((elapsed % 60))
for f in "${fail[@]}"; do echo "[check_no_cuda] $f" >&2; done
((${#fail[@]} == 0))
