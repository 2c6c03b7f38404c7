#!/usr/bin/env bash
# The check to run on a machine with a CUDA GPU and PyTorch installed (no package index needed):
# builds nanogpt-cpp against that PyTorch's LibTorch, runs the test suite (the CUDA tests run there),
# then trains the full Shakespeare preset for 200 iterations on the GPU in bf16 beside nanoGPT's
# train.py on the same GPU (--compile=False and --compile=True), a float16 (loss-scaled) run, and
# prints ms/iter (median of the logged iterations 10-200) and val loss at iteration 200 for each.
#
#   scripts/gpu_check.sh NANOGPT_DIR      # NANOGPT_DIR: a checkout of karpathy/nanoGPT (not shipped here)
#
# Libraries the GPU machine lacks (yaml-cpp, spdlog, fmt, GoogleTest, CLI11, nlohmann-json) are
# unpacked, not installed, from Debian packages copied into .devdeps/.
# cairo and pango are not among them: without them the build has no plots (-DNANOGPT_PLOTS=OFF).
set -euo pipefail
nanogpt_dir=${1:?usage: scripts/gpu_check.sh NANOGPT_DIR (a checkout of karpathy/nanoGPT)}
nanogpt_dir=$(cd "$nanogpt_dir" && pwd)
cd "$(dirname "$0")/.."
repo=$PWD
py=${PYTHON:-python3}
iters=${GPU_CHECK_ITERS:-200}

prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')
"$py" -c 'import torch; print("[gpu] torch", torch.__version__, "CUDA", torch.version.cuda, "|", torch.cuda.get_device_name(0))'
deps=$repo/.devdeps/root
if compgen -G ".devdeps/*.deb" >/dev/null; then
  mkdir -p "$deps"
  for f in .devdeps/*.deb; do dpkg -x "$f" "$deps"; done
  export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  prefix="$prefix;$deps/usr"
fi

echo "[gpu] build"
# Plots need cairo and pango, which a GPU image may lack: the check is about training and sampling.
plots=OFF
command -v pkg-config >/dev/null && pkg-config --exists cairo-svg pangocairo && plots=ON
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" -DNANOGPT_PLOTS=$plots \
  -DNANOGPT_PYTHON="$(command -v "$py")" >/tmp/gpu_check_configure.log 2>&1 || { cat /tmp/gpu_check_configure.log; exit 1; }
grep "nanogpt:" /tmp/gpu_check_configure.log || true
cmake --build build-cuda -j"$(nproc)" >/tmp/gpu_check_build.log 2>&1 || { tail -50 /tmp/gpu_check_build.log; exit 1; }

echo "[gpu] tests"
tests_ok=1
(cd build-cuda && ctest -j4 --timeout 600 --output-on-failure >/tmp/gpu_check_ctest.log 2>&1) || tests_ok=0
grep -E "tests passed|tests failed|\(Failed\)|\(SEGFAULT\)|Cuda\." /tmp/gpu_check_ctest.log | grep -v "Start" || true

work=$(mktemp -d)
cp -r "$nanogpt_dir" "$work/nanoGPT"
cp data/shakespeare_char/input.txt "$work/nanoGPT/data/shakespeare_char/"
mkdir -p "$work/stub" && : >"$work/stub/tiktoken.py" && : >"$work/stub/requests.py"  # imported, unused here
(cd "$work/nanoGPT" && PYTHONPATH=$work/stub "$py" data/shakespeare_char/prepare.py >/dev/null)

# median ms/iter over logged iterations 10..N and the val loss of the last evaluation
summarize() {  # name log kind(ours|nanogpt)
  "$py" - "$@" <<'PY'
import re, statistics, sys
name, path, kind = sys.argv[1:4]
text = open(path, errors="replace").read()
if kind == "ours":
    ms = [float(m.group(2)) for m in re.finditer(r"\[train\] iter (\d+) \| loss [\d.]+ \| lr \S+ \| ([\d.]+) ms", text) if int(m.group(1)) >= 10]
    val = re.findall(r"\[eval\] iter \d+ \| train [\d.]+ \| val ([\d.]+)", text)
else:
    ms = [float(m.group(2)) for m in re.finditer(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", text) if int(m.group(1)) >= 10]
    val = re.findall(r"step \d+: train loss [\d.]+, val loss ([\d.]+)", text)
print(f"{name:<34} {statistics.median(ms) if ms else float('nan'):>10.2f} ms/iter   val {val[-1] if val else 'n/a'}")
PY
}

common=(--max_iters="$iters" --eval_interval="$iters" --eval_iters=200 --log_interval=10)
echo "[gpu] full preset, $iters iterations, bf16"
build-cuda/nanogpt train configs/shakespeare_char.yaml --device=cuda --dtype=bfloat16 --out_dir="$work/ours" "${common[@]}" \
  >"$work/ours.log" 2>&1 || tail -5 "$work/ours.log"
build-cuda/nanogpt train configs/shakespeare_char.yaml --device=cuda --dtype=float16 --out_dir="$work/ours16" "${common[@]}" \
  >"$work/ours16.log" 2>&1 || tail -5 "$work/ours16.log"
for compile in False True; do
  (cd "$work/nanoGPT" && PYTHONPATH=$work/stub "$py" train.py config/train_shakespeare_char.py --device=cuda --dtype=bfloat16 \
     --compile=$compile --out_dir="$work/nano_$compile" "${common[@]}" >"$work/nano_$compile.log" 2>&1) ||
    tail -5 "$work/nano_$compile.log"
done
# The NCCL path: torchrun with one process per GPU (at least one), same preset.
ngpu=$("$py" -c 'import torch; print(torch.cuda.device_count())')
torchrun=$(dirname "$(command -v "$py")")/torchrun
echo "[gpu] data parallel: torchrun, $ngpu process(es), NCCL"
"$torchrun" --no-python --standalone --nproc_per_node="$ngpu" build-cuda/nanogpt train configs/shakespeare_char.yaml \
  --device=cuda --dtype=bfloat16 --out_dir="$work/ours_ddp" --gradient_accumulation_steps="$ngpu" "${common[@]}" \
  >"$work/ours_ddp.log" 2>&1 || tail -5 "$work/ours_ddp.log"
grep -m1 "\[ddp\]" "$work/ours_ddp.log" || true
echo
printf '%-34s %10s            %s\n' "run" "median" "val @ $iters"
summarize "nanogpt-cpp bf16" "$work/ours.log" ours
summarize "nanogpt-cpp float16 (loss scaling)" "$work/ours16.log" ours
summarize "nanogpt-cpp bf16, torchrun + NCCL" "$work/ours_ddp.log" ours
summarize "nanoGPT bf16 --compile=False" "$work/nano_False.log" nanogpt
summarize "nanoGPT bf16 --compile=True" "$work/nano_True.log" nanogpt
rm -rf "$work"
((tests_ok)) || { echo "[gpu] some tests failed: /tmp/gpu_check_ctest.log"; exit 1; }
