#!/bin/bash
# GPU machine: builds mt_test_cuda (sm_90), runs the CUDA op tests (compact reporter), then the
# attention benchmark and PyTorch SDPA on the same GPU. Logs under $OUT; a short summary last.
# Env: TEST_FILTER (Catch2 test spec, default all), BENCH=0 to skip the timings.
set -o pipefail
OUT=${OUT:-/tmp/mt_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
t0=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRAIN_CUDA_ARCHS=90 > "$OUT/cmake.log" 2>&1 ||
  { tail -30 "$OUT/cmake.log"; exit 1; }
ninja -C build mt_test_cuda > "$OUT/build.log" 2>&1 || { grep -A8 -E "error" "$OUT/build.log" | head -80; exit 1; }
t1=$(date +%s)
timeout 300 ./build/test/mt_test_cuda -r compact ${TEST_FILTER:+"$TEST_FILTER"} > "$OUT/test.log" 2>&1
rc=$?
t2=$(date +%s)
if [ "${BENCH:-1}" = 1 ]; then
  timeout 150 ./build/test/mt_test_cuda "[.bench]" > "$OUT/bench.log" 2>&1
  timeout 150 python3 benchmarks/kernels/bench_sdpa.py >> "$OUT/bench.log" 2>&1
fi
t3=$(date +%s)
echo "==== $(cat "$OUT/gpu.txt") | build $((t1 - t0)) s, tests $((t2 - t1)) s (rc $rc), bench $((t3 - t2)) s"
grep -E "failed|error|Error|FAILED" "$OUT/test.log" | cut -c1-400 | head -40
sed -n '/max relative error/,$p' "$OUT/test.log"
grep -E "test cases" "$OUT/test.log"
grep -E "BENCH|Error|error" "$OUT/bench.log" 2>/dev/null | cut -c1-300
