#!/usr/bin/env bash
# The check to run first on a machine with a CUDA GPU and PyTorch installed (no package index needed),
# in about 3 minutes on one H200 with 16 cores once built:
#   1. builds nanogpt-cpp against that PyTorch's LibTorch (the program, its CUDA plugin, and the tests
#      that run here: the CUDA tests, the device mix-up tests and the command-line tests);
#   2. runs the CUDA and device tests (the command-line tests run last, after the table);
#   3. trains the full Shakespeare preset for GPU_CHECK_ITERS iterations (default 200) in bf16 beside
#      nanoGPT's train.py on the same GPU (--compile=False and --compile=True), then in float16 with
#      loss scaling, then under torchrun with NCCL (one process per GPU);
#   4. samples from the bf16 run on the GPU beside nanoGPT's sample.py (tokens/s, start-up taken out);
#   5. prints one table: median ms/iter of the logged iterations from 10 on, tokens/s, MFU against the
#      GPU's dense bf16 peak, val loss at the last iteration, and peak GPU memory of each run.
#
#   scripts/gpu_check.sh NANOGPT_DIR      # NANOGPT_DIR: a checkout of karpathy/nanoGPT (not shipped here)
#
# GPU_CHECK_PREBUILT=DIR skips the build when DIR holds nanogpt, libnanogpt_cuda.so and the three test
# programs, built elsewhere against the same LibTorch version with -DNANOGPT_PLOTS=OFF, and they start
# here (they are run with this PyTorch's lib folder on LD_LIBRARY_PATH); otherwise it builds as above.
# GPU_CHECK_STEP_TIMEOUT (seconds, default 300) bounds each test program, training run and sample.
#
# Libraries the GPU machine lacks (yaml-cpp, spdlog, fmt, GoogleTest, CLI11, nlohmann-json, Gloo's
# headers) are unpacked, not installed, from Debian packages placed in .devdeps/. Without cairo and
# pango the build has no plots (-DNANOGPT_PLOTS=OFF): this check is about training and sampling.
set -euo pipefail
nanogpt_dir=${1:?usage: scripts/gpu_check.sh NANOGPT_DIR (a checkout of karpathy/nanoGPT)}
nanogpt_dir=$(cd "$nanogpt_dir" && pwd)
cd "$(dirname "$0")/.."
repo=$PWD
py=${PYTHON:-python3}
iters=${GPU_CHECK_ITERS:-200}
logs=${GPU_CHECK_LOGS:-/tmp/gpu_check}
mkdir -p "$logs"
start=$SECONDS
stamp() { echo "[gpu] $* ($((SECONDS - start)) s)"; }

prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')
"$py" -c 'import torch; print("[gpu] torch", torch.__version__, "CUDA", torch.version.cuda, "|", torch.cuda.get_device_name(0))'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/[gpu] /' || true
deps=$repo/.devdeps/root
if compgen -G ".devdeps/*.deb" >/dev/null; then
  mkdir -p "$deps"
  for f in .devdeps/*.deb; do dpkg -x "$f" "$deps"; done
  export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  prefix="$prefix;$deps/usr"
fi

torch_lib=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
step_timeout=${GPU_CHECK_STEP_TIMEOUT:-300}
bin=build-cuda
prebuilt=${GPU_CHECK_PREBUILT:-}
if [[ -n $prebuilt ]] && LD_LIBRARY_PATH=$torch_lib:${LD_LIBRARY_PATH:-} "$prebuilt/nanogpt" --version; then
  stamp "using the programs in $prebuilt"
  bin=$prebuilt
  export LD_LIBRARY_PATH=$torch_lib:${LD_LIBRARY_PATH:-}
else
  [[ -z $prebuilt ]] || stamp "the programs in $prebuilt do not start here; building"
  build=1
fi
if [[ -n ${build:-} ]]; then
stamp "build"
plots=OFF
command -v pkg-config >/dev/null && pkg-config --exists cairo-svg pangocairo && plots=ON
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B build-cuda "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DNANOGPT_PLOTS=$plots -DNANOGPT_PYTHON="$(command -v "$py")" >"$logs/configure.log" 2>&1 ||
  { cat "$logs/configure.log"; exit 1; }
grep "nanogpt:" "$logs/configure.log" || true
targets=(nanogpt test_cuda test_train_device test_cli)
cmake --build build-cuda -j"$(nproc)" --target "${targets[@]}" >"$logs/build.log" 2>&1 || { tail -50 "$logs/build.log"; exit 1; }
fi
[[ -f $bin/libnanogpt_cuda.so ]] || { echo "[gpu] error: no CUDA plugin in $bin (see $logs/configure.log)"; exit 1; }

tests_ok=1
run_tests() {
  for t in "$@"; do
    timeout "$step_timeout" "$bin/$t" --gtest_brief=1 >"$logs/$t.log" 2>&1 || tests_ok=0
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \] [A-Z]" "$logs/$t.log" | sed "s/^/  $t /" || true
  done
}
stamp "tests: CUDA, device mix-ups"
run_tests test_cuda test_train_device

work=$(mktemp -d)
cp -r "$nanogpt_dir" "$work/nanoGPT"
cp data/shakespeare_char/input.txt "$work/nanoGPT/data/shakespeare_char/"
mkdir -p "$work/stub" && : >"$work/stub/tiktoken.py" && : >"$work/stub/requests.py"  # imported, unused here
(cd "$work/nanoGPT" && PYTHONPATH=$work/stub "$py" data/shakespeare_char/prepare.py >/dev/null)

common=(--max_iters="$iters" --eval_interval="$iters" --eval_iters=200 --log_interval=10)
ours() {  # name, then arguments after "train configs/shakespeare_char.yaml"
  local name=$1
  shift
  stamp "ours: $name"
  timeout "$step_timeout" "$bin/nanogpt" train configs/shakespeare_char.yaml --device=cuda --out_dir="$work/$name" "${common[@]}" "$@" \
    >"$logs/$name.log" 2>&1 || tail -5 "$logs/$name.log"
}
ours ours_bf16 --dtype=bfloat16
ours ours_fp16 --dtype=float16
for compile in False True; do
  stamp "nanoGPT --compile=$compile"
  # Through runpy, so that its peak GPU memory can be read when it ends (train.py does not print it).
  (cd "$work/nanoGPT" && PYTHONPATH=$work/stub timeout "$step_timeout" "$py" - config/train_shakespeare_char.py --device=cuda --dtype=bfloat16 \
    --compile=$compile --out_dir="$work/nano_$compile" "${common[@]}" >"$logs/nano_$compile.log" 2>&1 <<'PY'
import runpy, sys, torch
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB held by tensors")
PY
  ) || tail -5 "$logs/nano_$compile.log"
done
ngpu=$("$py" -c 'import torch; print(torch.cuda.device_count())')
torchrun=$(dirname "$(command -v "$py")")/torchrun
[[ -x $torchrun ]] || torchrun="$py -m torch.distributed.run"
stamp "ours: torchrun, $ngpu process(es), NCCL"
timeout "$step_timeout" $torchrun --no-python --standalone --nproc_per_node="$ngpu" "$bin/nanogpt" train configs/shakespeare_char.yaml \
  --device=cuda --dtype=bfloat16 --out_dir="$work/ours_ddp" --gradient_accumulation_steps="$ngpu" "${common[@]}" \
  >"$logs/ours_ddp.log" 2>&1 || tail -5 "$logs/ours_ddp.log"
grep -m1 "\[ddp\] .* processes" "$logs/ours_ddp.log" || true

stamp "sampling on the GPU: 1000 new tokens, one sample; tokens/s with start-up taken out (a 1-token run's time)"
ms_of() {  # prints the wall milliseconds of a command, its output in $logs/sample.txt and .err
  local t0=$(date +%s%N)
  timeout "$step_timeout" "$@" >"$logs/sample.txt" 2>"$logs/sample.err" || { tail -3 "$logs/sample.err" >&2; : >"$logs/sample.failed"; }
  echo $((($(date +%s%N) - t0) / 1000000))
}
rate() {  # name, then the command without its token count (the last argument is the flag's name)
  local name=$1
  shift
  local one many
  one=$(ms_of "$@"1)
  many=$(ms_of "$@"1001)
  printf '  %-44s %6d ms for 1000 tokens + start-up, %7.0f tokens/s without start-up: %s\n' "$name" "$many" \
    "$(awk -v a="$one" -v b="$many" 'BEGIN { print (b > a ? 1000000 / (b - a) : 0) }')" "$(head -c 60 "$logs/sample.txt" | tr '\n' ' ')"
}
ours_sample=("$bin/nanogpt" sample --out_dir="$work/ours_bf16" --device=cuda --num_samples=1 --seed=1)
rate "nanogpt-cpp (KV cache, default dtype: float32)" "${ours_sample[@]}" --max_new_tokens=
rate "nanogpt-cpp (KV cache, bf16)" "${ours_sample[@]}" --dtype=bfloat16 --max_new_tokens=
rate "nanogpt-cpp --no_cache (float32)" "${ours_sample[@]}" --no_cache --max_new_tokens=
rate "nanogpt-cpp --beam=4 (float32)" "${ours_sample[@]}" --beam=4 --max_new_tokens=
if [[ -f $work/nano_False/ckpt.pt ]]; then
  (cd "$work/nanoGPT" && rate "nanoGPT sample.py (bf16, --compile=False)" env PYTHONPATH="$work/stub" "$py" sample.py \
    --out_dir="$work/nano_False" --device=cuda --dtype=bfloat16 --compile=False --num_samples=1 --max_new_tokens=)
fi
[[ ! -f $logs/sample.failed ]] || tests_ok=0
echo
"$py" - "$logs" "$iters" <<'PY'
import re, statistics, sys
logs, iters = sys.argv[1], sys.argv[2]

def read(name):
    try:
        return open(f"{logs}/{name}.log", errors="replace").read()
    except OSError:
        return ""

def ours(name):
    text = read(name)
    ms = [float(m.group(2)) for m in re.finditer(r"\[train\] iter (\d+) \| loss [\d.]+ \| lr \S+ \| ([\d.]+) ms", text) if int(m.group(1)) >= 10]
    mfu = [float(m.group(2)) for m in re.finditer(r"\[train\] iter (\d+) \|.*\| mfu ([\d.]+)%", text) if int(m.group(1)) >= 10]
    tokens = re.search(r"tokens per iteration will be: ([\d,]+)", text)
    val = re.findall(r"\[eval\] iter \d+ \| train [\d.]+ \| val ([\d.]+)", text)
    mem = re.search(r"peak GPU memory: (\d+) MiB held", text)
    return dict(ms=statistics.median(ms) if ms else None, mfu=statistics.median(mfu) if mfu else None,
                tokens=int(tokens.group(1).replace(",", "")) if tokens else None, val=val[-1] if val else None,
                mem=mem.group(1) if mem else None)

def nano(name):
    text = read(name)
    ms = [float(m.group(2)) for m in re.finditer(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", text) if int(m.group(1)) >= 10]
    tokens = re.search(r"tokens per iteration will be: ([\d,]+)", text)
    val = re.findall(r"step \d+: train loss [\d.]+, val loss ([\d.]+)", text)
    mem = re.search(r"peak GPU memory: (\d+) MiB held", text)
    return dict(ms=statistics.median(ms) if ms else None, mfu=None,
                tokens=int(tokens.group(1).replace(",", "")) if tokens else None, val=val[-1] if val else None,
                mem=mem.group(1) if mem else None)

runs = [("nanogpt-cpp bf16", ours("ours_bf16")), ("nanogpt-cpp float16 (loss scaling)", ours("ours_fp16")),
        ("nanogpt-cpp bf16, torchrun + NCCL", ours("ours_ddp")), ("nanoGPT bf16 --compile=False", nano("nano_False")),
        ("nanoGPT bf16 --compile=True", nano("nano_True"))]
ref = runs[0][1]
for name, r in runs:
    if r["ms"] and r["tokens"]:
        r["tok_s"] = r["tokens"] / (r["ms"] / 1000)
    # The same model and tokens per step: MFU scales with tokens/s from our bf16 run's (datasheet peak).
    if r["mfu"] is None and ref.get("mfu") and r.get("tok_s") and ref.get("tok_s"):
        r["mfu"] = ref["mfu"] * r["tok_s"] / ref["tok_s"]
fmt = lambda v, f: format(v, f) if v is not None else "n/a".rjust(int(re.match(r"\d+", f).group()))
print(f"{'run':<36} {'ms/iter':>9} {'tokens/s':>10} {'MFU %':>7} {'val @ ' + iters:>10} {'peak GPU MiB':>13}")
for name, r in runs:
    print(f"{name:<36} {fmt(r['ms'], '9.2f')} {fmt(r.get('tok_s'), '10.0f')} {fmt(r['mfu'], '7.1f')} "
          f"{r['val'] or 'n/a':>10} {r['mem'] or 'n/a':>13}")
for other in ("nanoGPT bf16 --compile=True", "nanoGPT bf16 --compile=False"):
    o = dict(runs)[other]
    if ref.get("tok_s") and o.get("tok_s"):
        print(f"nanogpt-cpp bf16 / {other}: {ref['tok_s'] / o['tok_s']:.2f}x tokens/s")
PY
rm -rf "$work"
stamp "tests: command line"
run_tests test_cli
stamp "done; logs in $logs"
((tests_ok)) || { echo "[gpu] some tests or samples failed: $logs"; exit 1; }
