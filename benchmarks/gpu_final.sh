#!/usr/bin/env bash
# GPU machine, one call: GPU tests, benchmarks/run_gpu_bench.sh (megatrain and the PyTorch reference, all
# four configs, one run), then a per-op profile of each config with the time left. Uses the binaries built on the build machine when they
# run here (see gpu_profile.sh), else builds them. Failed [attention] or [attention_fused] tests switch cuDNN's
# attention off for the profile and the benchmark (MT_BENCH_EXTRA="--set training.attention_backend=own"; the
# summary says so); the other kernels' variants are chosen by shape, with nothing to switch.
# Logs in $OUT/logs.tgz (tests, profile) and $OUT/all.tgz (+ benchmark); the benchmark table printed last.
#   usage: OUT=dir benchmarks/gpu_final.sh REFERENCE.py
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt_out}
ref=${1:-.carry/torch_gpt.py}
L=/tmp/mt_final/logs  # packed into $OUT as tarballs (few files come back from a device call)
B=/tmp/mt_final/bench
mkdir -p "$L" "$OUT"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader >"$L/gpu.txt" 2>&1
if [ "$(cd /work/main 2>/dev/null && pwd -P)" != "$(pwd -P)" ] && [ ! -e /work/main ]; then
  mkdir -p /work && ln -s "$PWD" /work/main
fi
BIN=build-perf/megatrain
TEST=build-perf/test/mt_test_cuda
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ldd "$BIN" "$TEST" >"$L/ldd.log" 2>&1
if ! "$BIN" --version >"$L/bin_check.log" 2>&1 || grep -q "not found" "$L/ldd.log"; then
  echo "carried binaries do not run here: building" >&2
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64
  rm -rf build-perf
  cmake -S . -B build-perf -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRAIN_CUDA_ARCHS=90 >"$L/cmake.log" 2>&1 &&
    ninja -C build-perf megatrain mt_test_cuda >"$L/build.log" 2>&1 ||
    { grep -B2 -A8 -E "error" "$L/build.log" | head -60; exit 1; }
fi
mkdir -p build-bench && ln -sf ../build-perf/megatrain build-bench/megatrain
t1=$(date +%s)

failed=""
tst() {  # tst NAME SECONDS SPEC
  timeout "$2" "$TEST" -r compact "$3" >"$L/test_$1.log" 2>&1 || failed="$failed $1"
}
tst attention 120 "[attention]"
tst attention_fused 60 "[attention_fused]"
tst linear_gelu 60 "[linear_gelu]"
tst norm 60 "[norm]"
tst training 150 "[training]"
tst rest 90 "~[attention]~[attention_fused]~[linear_gelu]~[norm]~[training]"
case "$failed" in *attention*) export MT_BENCH_EXTRA="--set training.attention_backend=own" ;; esac
read -ra extra <<<"${MT_BENCH_EXTRA:-}"
t2=$(date +%s)

tar czf "$OUT/logs.tgz" -C /tmp/mt_final logs 2>/dev/null
# Within the call's limit: the benchmark gets what is left before DEADLINE_S (its jsonl files survive a
# timeout in all.tgz; the reference prints one line per config as it finishes); the profile runs after
# it, if at least 30 s are left.
left=$((t0 + ${DEADLINE_S:-380} - $(date +%s)))
timeout "$left" bash benchmarks/run_gpu_bench.sh "$B" "$ref" >"$OUT/table.txt" 2>"$L/bench.err" ||
  echo "benchmark stopped after ${left} s (rc $?)" >&2
t3=$(date +%s)
source benchmarks/bench_common.sh
bench_set "${PROFILE_ITERS:-4}"
for c in gpt2-124m gpt2-350m llama-1b llama-3b; do
  left=$((t0 + ${DEADLINE_S:-380} - $(date +%s)))
  ((left >= 30)) || break
  MT_OP_PROFILE="$L/prof-$c.txt" timeout "$left" "$BIN" train --config "configs/$c.yaml" "${BENCH_SET[@]}" "${extra[@]}" \
    --set training.micro_batch_size="${BENCH_MBS[$c]}" --set training.global_batch_size="${BENCH_MBS[$c]}" \
    --set logging.metrics_file="$L/prof-$c.jsonl" >"$L/prof-$c.log" 2>&1 || echo "profile $c failed" >&2
done
t4=$(date +%s)
tar czf "$OUT/all.tgz" -C /tmp/mt_final logs bench 2>/dev/null

echo "==== $(cat "$L/gpu.txt") | setup $((t1 - t0)) s, tests $((t2 - t1)) s, bench $((t3 - t2)) s, profile $((t4 - t3)) s"
echo "failed tests:${failed:- none}; overrides of the benchmark and profile: ${MT_BENCH_EXTRA:-none}"
grep -h -E "test cases|assertions" "$L"/test_*.log | sort | uniq -c
grep -h -E "FAILED|cuDNN attention" "$L"/test_*.log "$L"/prof-*.log 2>/dev/null | cut -c1-200 | sort | uniq -c | head -12
python3 - "$L" "${PROFILE_ITERS:-4}" <<'PY'
import os, sys
L, iters = sys.argv[1], int(sys.argv[2])
for c in ["gpt2-124m", "gpt2-350m", "llama-1b", "llama-3b"]:
    p = os.path.join(L, f"prof-{c}.txt")
    if not os.path.exists(p):
        continue
    lines = open(p).read().splitlines()
    print(f"== {c} (per iteration, medians): {lines[0][12:140]}")
    for l in lines[2:12]:
        f = l.split(None, 5)
        if len(f) == 6:
            print(f"  {float(f[0]) / iters:8.3f} ms/it {int(f[1]) // iters:>4}/it x {float(f[2]):8.4f} ms  {f[5][:72]}")
PY
cat "$L/bench.err" | tail -5
cat "$OUT/table.txt"
