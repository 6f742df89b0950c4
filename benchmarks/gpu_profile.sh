#!/usr/bin/env bash
# GPU machine, one call: where the time of a training step goes. Uses the binaries built on the build
# machine when they run here (carried: build-perf/megatrain, build-perf/test/mt_test_cuda, and the
# libraries whose sonames differ between the machines in .carry/lib), else builds them here. Then:
#   1. GPU tests: attention (cuDNN and our kernels), norms, the GPU-vs-CPU training parity test;
#   2. the attention timings (cuDNN's, then our kernels', in one test);
#   3. each benchmark config for a few iterations with MT_OP_PROFILE (per-op GPU time);
#   4. (PROFILE_BASELINE=1) the same configs on our attention kernels (training.attention_backend: own), no profiling.
# Logs under $OUT; a short summary last.
#   usage: OUT=dir benchmarks/gpu_profile.sh [CONFIGS...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt_out}
mkdir -p "$OUT"
configs=("$@")
((${#configs[@]})) || configs=(gpt2-124m gpt2-350m llama-1b llama-3b)
iters=${PROFILE_ITERS:-8}
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader >"$OUT/gpu.txt" 2>&1
# The test binary reads configs and the megatrain binary through the paths of the build machine.
if [ "$(cd /work/main 2>/dev/null && pwd -P)" != "$(pwd -P)" ] && [ ! -e /work/main ]; then
  mkdir -p /work && ln -s "$PWD" /work/main
fi
BIN=build-perf/megatrain
TEST=build-perf/test/mt_test_cuda
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ldd "$BIN" "$TEST" >"$OUT/ldd.log" 2>&1
if ! "$BIN" --version >"$OUT/bin_check.log" 2>&1 || grep -q "not found" "$OUT/ldd.log"; then
  echo "carried binaries do not run here ($(tail -1 "$OUT/bin_check.log")): building" >&2
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64
  rm -rf build-perf
  cmake -S . -B build-perf -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRAIN_CUDA_ARCHS=90 >"$OUT/cmake.log" 2>&1 &&
    ninja -C build-perf megatrain mt_test_cuda >"$OUT/build.log" 2>&1 ||
    { grep -B2 -A8 -E "error" "$OUT/build.log" | head -60; exit 1; }
fi
t1=$(date +%s)

timeout 240 "$TEST" -r compact "[attention],[norm]" >"$OUT/test_ops.log" 2>&1
rc_ops=$?
timeout 240 "$TEST" -r compact "[training]" >"$OUT/test_training.log" 2>&1
rc_train=$?
t2=$(date +%s)
timeout 120 "$TEST" "[.bench][attention]" >"$OUT/bench_attn.log" 2>&1
t3=$(date +%s)

source benchmarks/bench_common.sh
run() {  # run TAG CONFIG ITERS [ENV=VALUE | --set=KEY=VALUE ...]
  local tag=$1 c=$2 n=$3 envs=() sets=()
  shift 3
  for w in "$@"; do
    case $w in --set=*) sets+=(--set "${w#--set=}") ;; *) envs+=("$w") ;; esac
  done
  bench_set "$n"
  env "${envs[@]}" timeout 300 "$BIN" train --config "configs/$c.yaml" "${BENCH_SET[@]}" "${sets[@]}" \
    --set training.micro_batch_size="${BENCH_MBS[$c]}" --set training.global_batch_size="${BENCH_MBS[$c]}" \
    --set logging.metrics_file="$OUT/$tag-$c.jsonl" \
    >"$OUT/$tag-$c.log" 2>&1 || echo "$tag $c failed: $(tail -2 "$OUT/$tag-$c.log")" >&2
}
for c in "${configs[@]}"; do run prof "$c" "$iters" MT_OP_PROFILE="$OUT/prof-$c.txt"; done
t4=$(date +%s)
if [ "${PROFILE_BASELINE:-0}" = 1 ]; then
  for c in "${configs[@]}"; do run base "$c" "$iters" --set=training.attention_backend=own; done
fi
t5=$(date +%s)

echo "==== $(cat "$OUT/gpu.txt") | setup $((t1 - t0)) s, tests $((t2 - t1)) s (rc $rc_ops/$rc_train), attn bench $((t3 - t2)) s, profile $((t4 - t3)) s, baseline $((t5 - t4)) s"
grep -h -E "cuDNN|FAILED|failed" "$OUT"/test_*.log "$OUT"/prof-*.log 2>/dev/null | cut -c1-300 | sort | uniq -c | head -20
grep -h -E "test cases|assertions" "$OUT"/test_*.log
grep -h "BENCH" "$OUT/bench_attn.log" | cut -c1-160
python3 - "$OUT" "$iters" "${configs[@]}" <<'PY'
import json, os, sys
out, iters, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def ms(tag, c):
    p = os.path.join(out, f"{tag}-{c}.jsonl")
    if not os.path.exists(p): return float("nan"), float("nan")
    r = [json.loads(l) for l in open(p)]
    r = [x for x in r if "ms_per_iter" in x and x["iteration"] > 2]
    if not r: return float("nan"), float("nan")
    return sum(x["ms_per_iter"] for x in r) / len(r), max(x.get("mem_gib", 0) for x in r)
for c in configs:
    m, mem = ms("prof", c)
    b, bmem = ms("base", c)
    print(f"== {c}: profiled {m:.1f} ms/iter, {mem:.1f} GiB | baseline {b:.1f} ms/iter, {bmem:.1f} GiB")
    p = os.path.join(out, f"prof-{c}.txt")
    if os.path.exists(p):
        lines = open(p).read().splitlines()
        print("  " + lines[0][:150])
        for l in lines[2:16]:  # median x calls, calls, median ms, total ms, %, op
            f = l.split(None, 5)
            if len(f) == 6:
                print(f"  {float(f[0]) / iters:8.3f} ms/it {f[4]:>6}%  {f[5][:90]}")
PY
