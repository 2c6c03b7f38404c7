#!/usr/bin/env bash
# The check to run first on a machine with a CUDA GPU and PyTorch installed (no package index needed),
# in about 6 minutes on one H200 with 16 cores once built (8 at most, to fit a 15-minute lease):
#   1. builds nanogpt-cpp against that PyTorch's LibTorch (the program, its CUDA plugin, and the tests
#      that run here: the CUDA tests, the device mix-up tests and the command-line tests);
#   2. runs the CUDA and device tests, among them 20 steps replayed as CUDA graphs against eager ones
#      (same seeds), one step under c10's sync debug mode "error", and a Kineto profile of 3 steps of
#      the full preset, eager and as graphs (GPU busy against wall time, kernels per step, the top
#      kernels), printed here (the command-line tests run last, after the tables);
#   3. trains the full Shakespeare preset for GPU_CHECK_ITERS iterations (default 200) in bf16 beside
#      nanoGPT's train.py on the same GPU (--compile=False and --compile=True), with CUDA graphs
#      (cuda_graphs: auto) and without, then in float16 with loss scaling, then under torchrun with
#      NCCL (one process per GPU);
#   4. samples from the bf16 run on the GPU beside nanoGPT's sample.py (tokens/s, start-up taken out);
#   5. prints one table: median ms/iter of the logged iterations from 10 on, tokens/s, MFU against the
#      GPU's dense bf16 peak, val loss at the last iteration, and peak GPU memory of each run;
#   6. at GPT-2 124M's shape (configs/gpt2_124m_bench.yaml, random tokens): `nanogpt bench` (eager
#      steps), `nanogpt train` for 60 iterations with and without CUDA graphs, and nanoGPT's bench.py
#      (real_data=False, compile=True and False), in a second table: ms/iter, tokens/s, MFU, peak memory.
#
#   scripts/gpu_check.sh NANOGPT_DIR      # NANOGPT_DIR: a checkout of karpathy/nanoGPT (not shipped here)
#
# GPU_CHECK_PREBUILT=DIR skips the build when DIR holds nanogpt, libnanogpt_cuda.so and the three test
# programs, built elsewhere against the same LibTorch version with -DNANOGPT_PLOTS=OFF, and they start
# here (they are run with this PyTorch's lib folder on LD_LIBRARY_PATH); otherwise it builds as above.
# GPU_CHECK_STEP_TIMEOUT (seconds, default 300) bounds each test program, training run and sample.
# GPU_CHECK_DRY=1 runs the script's own steps on the CPU with the programs in build/ (no build, no
# nanoGPT, no torchrun, tiny models): a check of the script, not of a GPU. NANOGPT_DIR may be omitted then.
#
# Libraries the GPU machine lacks (yaml-cpp, spdlog, fmt, GoogleTest, CLI11, nlohmann-json, Gloo's
# headers) are unpacked, not installed, from Debian packages placed in .devdeps/. Without cairo and
# pango the build has no plots (-DNANOGPT_PLOTS=OFF): this check is about training and sampling.
set -euo pipefail
dry=${GPU_CHECK_DRY:-0}
if ((dry)); then
  nanogpt_dir=${1:-}
else
  nanogpt_dir=${1:?usage: scripts/gpu_check.sh NANOGPT_DIR (a checkout of karpathy/nanoGPT)}
  nanogpt_dir=$(cd "$nanogpt_dir" && pwd)
fi
cd "$(dirname "$0")/.."
repo=$PWD
py=${PYTHON:-python3}
iters=${GPU_CHECK_ITERS:-200}
device=cuda
# The dry run: the CPU, the programs in build/, a few iterations of shrunken models.
shrink=()
if ((dry)); then
  device=cpu iters=${GPU_CHECK_ITERS:-4}
  export GPU_CHECK_PREBUILT=${GPU_CHECK_PREBUILT:-$repo/build}
  shrink=(--n_layer=1 --n_head=2 --n_embd=32 --block_size=32 --batch_size=2)
fi
logs=${GPU_CHECK_LOGS:-/tmp/gpu_check}
mkdir -p "$logs"
start=$SECONDS
stamp() { echo "[gpu] $* ($((SECONDS - start)) s)"; }

prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')
((dry)) || "$py" -c 'import torch; print("[gpu] torch", torch.__version__, "CUDA", torch.version.cuda, "|", torch.cuda.get_device_name(0))'
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
((dry)) || [[ -f $bin/libnanogpt_cuda.so ]] || { echo "[gpu] error: no CUDA plugin in $bin (see $logs/configure.log)"; exit 1; }

tests_ok=1
run_tests() {
  for t in "$@"; do
    timeout "$step_timeout" "$bin/$t" --gtest_brief=1 >"$logs/$t.log" 2>&1 || tests_ok=0
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \] [A-Z]" "$logs/$t.log" | sed "s/^/  $t /" || true
  done
}
stamp "tests: CUDA (graphs, sync debug mode, profile), device mix-ups"
run_tests test_cuda test_train_device
grep -h "^\[profile\]\|^\[sync\]" "$logs/test_cuda.log" || true

work=$(mktemp -d)
source scripts/nanogpt_peer.sh
((dry)) || nanogpt_peer_workspace "$nanogpt_dir" "$work" "$py"
nano() { ((!dry)); }  # nanoGPT's runs: not in the dry run

common=(--max_iters="$iters" --eval_interval="$iters" --eval_iters=$((dry ? 2 : 200)) --log_interval=$((dry ? 1 : 10)))
ours() {  # name, then arguments after "train configs/shakespeare_char.yaml"
  local name=$1
  shift
  stamp "ours: $name"
  timeout "$step_timeout" "$bin/nanogpt" train configs/shakespeare_char.yaml --device=$device --out_dir="$work/$name" "${common[@]}" \
    "${shrink[@]}" "$@" >"$logs/$name.log" 2>&1 || tail -5 "$logs/$name.log"
  grep -h "CUDA graphs" "$logs/$name.log" | sed 's/^.*\] \[/  [/' || true
}
ours ours_bf16 --dtype=bfloat16
ours ours_bf16_eager --dtype=bfloat16 --cuda_graphs=false
ours ours_fp16 --dtype=float16
for compile in False True; do
  nano || break
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
if nano; then
torchrun=$(dirname "$(command -v "$py")")/torchrun
[[ -x $torchrun ]] || torchrun="$py -m torch.distributed.run"
stamp "ours: torchrun, $ngpu process(es), NCCL"
timeout "$step_timeout" $torchrun --no-python --standalone --nproc_per_node="$ngpu" "$bin/nanogpt" train configs/shakespeare_char.yaml \
  --device=cuda --dtype=bfloat16 --out_dir="$work/ours_ddp" --gradient_accumulation_steps="$ngpu" "${common[@]}" \
  >"$logs/ours_ddp.log" 2>&1 || tail -5 "$logs/ours_ddp.log"
grep -m1 "\[ddp\] .* processes" "$logs/ours_ddp.log" || true
grep -h "\[ddp\] CUDA graphs" "$logs/ours_ddp.log" || true
fi

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
ours_sample=("$bin/nanogpt" sample --out_dir="$work/ours_bf16" --device=$device --num_samples=1 --seed=1)
rate "nanogpt-cpp (KV cache, default dtype: float32)" "${ours_sample[@]}" --max_new_tokens=
rate "nanogpt-cpp (KV cache, bf16)" "${ours_sample[@]}" --dtype=bfloat16 --max_new_tokens=
rate "nanogpt-cpp --no_cache (float32)" "${ours_sample[@]}" --no_cache --max_new_tokens=
rate "nanogpt-cpp --beam=4 (float32)" "${ours_sample[@]}" --beam=4 --max_new_tokens=
if nano && [[ -f $work/nano_False/ckpt.pt ]]; then
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

runs = [("nanogpt-cpp bf16", ours("ours_bf16")), ("nanogpt-cpp bf16, cuda_graphs false", ours("ours_bf16_eager")),
        ("nanogpt-cpp float16 (loss scaling)", ours("ours_fp16")),
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

# GPT-2 124M's shape on random tokens: random text over 50304 distinct characters makes the character
# tokenizer's vocabulary exactly that (GPT-2's 50257 padded to a multiple of 64).
stamp "GPT-2 124M shape: nanogpt bench, nanogpt train with and without CUDA graphs, nanoGPT bench.py"
"$py" - "$work/random_50304" <<'PY'
import os, random, sys
ranges = [(0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x3400, 0x4DBF), (0x20000, 0x2A6DF)]  # CJK and Hangul: one code point, one token
chars = [chr(c) for lo, hi in ranges for c in range(lo, hi + 1)][:50304]
rng = random.Random(1337)
text = "".join(chars) + "".join(rng.choice(chars) for _ in range(2_000_000))  # every character at least once
os.makedirs(sys.argv[1], exist_ok=True)
open(os.path.join(sys.argv[1], "input.txt"), "w", encoding="utf-8").write(text)
PY
gpt2=(configs/gpt2_124m_bench.yaml --dataset="$work/random_50304" --device=$device)
((dry)) && gpt2+=(--n_layer=1 --n_head=2 --n_embd=32 --block_size=64 --batch_size=2)
timeout "$step_timeout" "$bin/nanogpt" bench "${gpt2[@]}" --iters $((dry ? 2 : 20)) --warmup $((dry ? 1 : 10)) --sample_tokens 0 \
  >"$logs/gpt2_bench.log" 2>&1 || tail -5 "$logs/gpt2_bench.log"
for graphs in auto false; do
  timeout "$step_timeout" "$bin/nanogpt" train "${gpt2[@]}" --cuda_graphs=$graphs --out_dir="$work/gpt2_$graphs" \
    --max_iters=$((dry ? 4 : 60)) --eval_interval=1000 --eval_iters=2 --log_interval=$((dry ? 1 : 10)) --plot=false \
    >"$logs/gpt2_train_$graphs.log" 2>&1 || tail -5 "$logs/gpt2_train_$graphs.log"
done
for compile in False True; do
  nano || break
  (cd "$work/nanoGPT" && PYTHONPATH=$work/stub timeout "$step_timeout" "$py" - --real_data=False --compile=$compile \
    >"$logs/gpt2_nano_$compile.log" 2>&1 <<'PY'
import runpy, sys, torch
sys.argv = ["bench.py"] + sys.argv[1:]
runpy.run_path("bench.py", run_name="__main__")
print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB held by tensors")
PY
  ) || tail -5 "$logs/gpt2_nano_$compile.log"
done
echo
"$py" - "$logs" <<'PY'
import re, sys
logs = sys.argv[1]
read = lambda name: open(f"{logs}/{name}.log", errors="replace").read() if __import__("os").path.exists(f"{logs}/{name}.log") else ""
tokens = 12 * 1024  # bench.py's batch_size x block_size, and the config's
rows = []
b = read("gpt2_bench")
m = re.search(r"train step: median ([\d.]+) ms.*?\| MFU ([\d.]+)%", b)
mem = re.search(r"peak GPU memory: (\d+) MiB held", b)
rows.append(("nanogpt-cpp bench (eager steps)", float(m.group(1)) if m else None, float(m.group(2)) if m else None, mem and mem.group(1)))
for graphs in ("auto", "false"):
    t = read(f"gpt2_train_{graphs}")
    ms = [float(x.group(2)) for x in re.finditer(r"\[train\] iter (\d+) \| loss \S+ \| lr \S+ \| ([\d.]+) ms", t) if int(x.group(1)) >= 20]
    mfu = [float(x.group(2)) for x in re.finditer(r"\[train\] iter (\d+) \|.*\| mfu ([\d.]+)%", t) if int(x.group(1)) >= 20]
    mem = re.search(r"peak GPU memory: (\d+) MiB held", t)
    med = lambda v: sorted(v)[len(v) // 2] if v else None
    rows.append((f"nanogpt-cpp train, cuda_graphs {graphs}", med(ms), med(mfu), mem and mem.group(1)))
for compile in ("False", "True"):
    t = read(f"gpt2_nano_{compile}")
    m = re.search(r"time per iteration: ([\d.]+)ms", t)
    mem = re.search(r"peak GPU memory: (\d+) MiB held", t)
    rows.append((f"nanoGPT bench.py --compile={compile}", float(m.group(1)) if m else None, None, mem and mem.group(1)))
ref = next((r for r in rows if r[1] and r[2]), None)  # bench.py's own MFU is against an A100: scale ours instead
print(f"{'GPT-2 124M shape, random tokens':<40} {'ms/iter':>9} {'tokens/s':>10} {'MFU %':>7} {'peak GPU MiB':>13}")
for name, ms, mfu, mem in rows:
    if mfu is None and ms and ref:
        mfu = ref[2] * ref[1] / ms
    f = lambda v, spec: format(v, spec) if v is not None else "n/a".rjust(int(spec.split(".")[0]))
    print(f"{name:<40} {f(ms, '9.2f')} {f(tokens / (ms / 1000) if ms else None, '10.0f')} {f(mfu, '7.1f')} {mem or 'n/a':>13}")
best = min((r[1] for r in rows[:3] if r[1]), default=None)
nano_c = rows[4][1]
if best and nano_c:
    print(f"nanogpt-cpp (fastest) / nanoGPT bench.py --compile=True: {nano_c / best:.2f}x tokens/s")
PY
# ---- sampling and serving: the static KV cache, one decode step as a CUDA graph ----
# `sample` tokens/s (start-up, graph capture included, taken out) on the full preset (the bf16 run above)
# and on a Tang-shaped model (configs/tang_poems.yaml's 6 x 384 over a 7443-character vocabulary,
# random text, two iterations: speed does not depend on what it learned): the general path, the static
# cache kernel by kernel, and its step replayed as a CUDA graph, beside nanoGPT's sample.py; then
# scripts/serve_bench.py with 1, 16 and 64 clients (TTFT, time per output token); then the greedy
# equality tests (alone against a batch of 16, fp32 with TF32 off).
stamp "sampling and serving: the static KV cache and its step as CUDA graphs"
"$py" - "$work/random_7443" <<'PY'
import os, random, sys
chars = ["\n"] + [chr(c) for c in range(0x4E00, 0x4E00 + 7442)]  # the Tang vocabulary's size, "\n" (the default prompt) among them
rng = random.Random(1337)
text = "".join(chars) + "".join(rng.choice(chars) for _ in range(300_000))
os.makedirs(sys.argv[1], exist_ok=True)
open(os.path.join(sys.argv[1], "input.txt"), "w", encoding="utf-8").write(text)
PY
timeout "$step_timeout" "$bin/nanogpt" train configs/tang_poems.yaml --dataset="$work/random_7443" --device=$device \
  --out_dir="$work/tang_shape" --max_iters=2 --eval_interval=1000 --eval_iters=1 --log_interval=1 --plot=false "${shrink[@]}" \
  >"$logs/tang_shape.log" 2>&1 || tail -5 "$logs/tang_shape.log"
for model in ours_bf16 tang_shape; do
  s=("$bin/nanogpt" sample --out_dir="$work/$model" --device=$device --num_samples=1 --seed=1)
  rate "$model: general path (float32)" "${s[@]}" --decoder=general --max_new_tokens=
  rate "$model: static cache, eager (float32)" "${s[@]}" --decoder=static --max_new_tokens=
  rate "$model: static cache, CUDA graphs (float32)" "${s[@]}" --decoder=graph --max_new_tokens=
  grep -h "no CUDA graph" "$logs/sample.err" | sed 's/^/  /' || true
  rate "$model: static cache, CUDA graphs (bf16)" "${s[@]}" --decoder=graph --dtype=bfloat16 --max_new_tokens=
done
if nano && [[ -f $work/nano_False/ckpt.pt ]]; then
  (cd "$work/nanoGPT" && rate "nanoGPT sample.py (float32, --compile=False)" env PYTHONPATH="$work/stub" "$py" sample.py \
    --out_dir="$work/nano_False" --device=cuda --dtype=float32 --compile=False --num_samples=1 --max_new_tokens=)
fi
[[ ! -f $logs/sample.failed ]] || tests_ok=0
for model in ours_bf16 tang_shape; do
  stamp "serve_bench: $model, 1, 16 and 64 clients, 200 tokens a request (float32, 64 slots)"
  timeout "$step_timeout" "$py" scripts/serve_bench.py --out_dir="$work/$model" --nanogpt="$bin/nanogpt" --device=$device \
    --dtype=float32 --threads=8 --parallel=64 --clients=1,16,64 --tokens=$((dry ? 20 : 200)) --requests-per-client=2 \
    >"$logs/serve_bench_$model.log" 2>&1 || { tail -5 "$logs/serve_bench_$model.log"; tests_ok=0; }
  grep -v "^$" "$logs/serve_bench_$model.log" | sed 's/^/  /' || true
done
stamp "greedy text alone and in a batch of 16 (fp32, TF32 off), graphed greedy against the general path"
timeout "$step_timeout" "$bin/test_cuda" --gtest_filter='CudaSampling.*' >"$logs/test_cuda_sampling.log" 2>&1 || tests_ok=0
grep -E "^\[ +(OK|FAILED|SKIPPED) +\]" "$logs/test_cuda_sampling.log" | sed 's/^/  /' || true

rm -rf "$work"
if ((!dry)); then
  stamp "tests: command line"
  run_tests test_cli
fi
stamp "done; logs in $logs"
((tests_ok)) || { echo "[gpu] some tests or samples failed: $logs"; exit 1; }
