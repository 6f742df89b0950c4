#!/bin/bash
# GPU machine, one call: builds megatrain and mt_test_cuda (sm_90), runs the CUDA MoE tests against the CPU, the
# per-op timings of one MoE layer (exact groups and padded batched, test/cuda/test_cuda_moe_bench.cpp), the
# end-to-end MoE benchmark against torch_moe.py (benchmarks/run_gpu_bench.sh, iterations 21-40 averaged), then a
# per-op profile (MT_OP_PROFILE) of a short run of each config. Logs in $OUT/logs.tgz; a summary on stdout (the
# tests' result last).
# usage: moe_speed.sh REFERENCE.py [ITERS_PROFILE]   (REFERENCE.py "none": build, tests and megatrain's side of the
# end-to-end benchmark only)
set -o pipefail
FINAL=${OUT:-/tmp/mt_out}
OUT=$(mktemp -d)
ref=${1:?usage: moe_speed.sh REFERENCE.py}
piters=${2:-25}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
t0=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRAIN_CUDA_ARCHS=90 > "$OUT/cmake.log" 2>&1 ||
  { tail -30 "$OUT/cmake.log"; exit 1; }
ninja -C build -j"$(nproc)" megatrain mt_test_cuda > "$OUT/build.log" 2>&1 || { grep -A8 -E "error" "$OUT/build.log" | head -80; exit 1; }
t1=$(date +%s)
echo "build $((t1 - t0)) s"
timeout 150 ./build/test/mt_test_cuda -r compact "[moe]~[.bench]" > "$OUT/test.log" 2>&1
echo "tests $(($(date +%s) - t1)) s (rc $?)"
grep -E "failed|FAILED|error" "$OUT/test.log" | cut -c1-400 | head -30
tail -3 "$OUT/test.log"
if [ "$ref" = none ]; then
  source benchmarks/bench_common.sh
  bench_set 40
  for c in moe-8x-top2 moe-64x-top8; do
    timeout 90 build/megatrain train --config "configs/$c.yaml" "${BENCH_SET[@]}" --set logging.metrics_file="$OUT/$c.jsonl" \
      > "$OUT/$c.log" 2>&1 || echo "$c failed: $(tail -2 "$OUT/$c.log")"
    python3 - "$OUT/$c.jsonl" "$c" <<'PY'
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rs = [r for r in rs if "loss" in r]
late = [r for r in rs if r["iteration"] > 20]
ms = sum(r["ms_per_iter"] for r in late) / len(late)
print(f"{sys.argv[2]}: iterations 21-40 {ms:.1f} ms/iter, {16384 / ms * 1e3:.0f} tok/s, "
      f"{sum(r['tflops_per_gpu'] for r in late) / len(late):.1f} TFLOP/s, MFU {100 * sum(r['mfu'] for r in late) / len(late):.1f}%, "
      f"peak {max(r['mem_gib'] for r in rs):.2f} GiB, loss {rs[-1]['loss']:.4f}; ms/iter {[round(r['ms_per_iter']) for r in rs]}")
PY
  done
  echo "== tests:"; grep -E "failed|FAILED" "$OUT/test.log" | cut -c1-300 | head -20; tail -2 "$OUT/test.log"
  mkdir -p "$FINAL" && tar czf "$FINAL/logs.tgz" -C "$OUT" .
  exit 0
fi
t2=$(date +%s)
timeout 120 ./build/test/mt_test_cuda "[.bench][moe]" > "$OUT/bench.log" 2>&1
grep -E "BENCH|error" "$OUT/bench.log" | cut -c1-160
echo "op bench $(($(date +%s) - t2)) s"
t3=$(date +%s)
ln -sfn build build-bench
MT_BENCH_ITERS=40 MT_BENCH_WARMUP=20 timeout 330 benchmarks/run_gpu_bench.sh "$OUT/moe" "$ref" moe-8x-top2 moe-64x-top8 2>&1
echo "e2e bench $(($(date +%s) - t3)) s"
for c in moe-8x-top2 moe-64x-top8; do
  grep -oE "load max/mean [0-9.]+" "$OUT/moe/megatrain-$c.log" | tr '\n' ' ' | cut -c1-400; echo
done
source benchmarks/bench_common.sh
bench_set "$piters"
for c in moe-8x-top2 moe-64x-top8; do
  MT_OP_PROFILE="$OUT/profile-$c.txt" timeout 60 build/megatrain train --config "configs/$c.yaml" "${BENCH_SET[@]}" \
    --set logging.metrics_file="$OUT/profile-$c.jsonl" > "$OUT/profile-$c.log" 2>&1 || echo "profile $c failed"
  echo "== profile $c"; head -45 "$OUT/profile-$c.txt" | cut -c1-170
done
echo "total $(($(date +%s) - t0)) s"
echo "== tests:"; grep -E "failed|FAILED" "$OUT/test.log" | cut -c1-300 | head -20; tail -2 "$OUT/test.log"
mkdir -p "$FINAL" && tar czf "$FINAL/logs.tgz" -C "$OUT" .
