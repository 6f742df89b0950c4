#!/bin/bash
# GPU machine: builds mt_test_cuda (sm_90), runs the CUDA MoE op tests against the CPU, the per-op timings of one
# MoE layer at the shapes of configs/moe-8x-top2.yaml and moe-64x-top8.yaml (test/cuda/test_cuda_moe_bench.cpp),
# and the reference's MoE layer alone (bench_moe_torch.py) on the same GPU. Logs under $OUT; a summary last.
# usage: moe_gpu.sh [REFERENCE_DIR]   (holding torch_moe.py and torch_gpt.py; default ../shared/reference)
set -o pipefail
OUT=${OUT:-/tmp/mt_out}
ref=${1:-../shared/reference}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
t0=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRAIN_CUDA_ARCHS=90 > "$OUT/cmake.log" 2>&1 ||
  { tail -30 "$OUT/cmake.log"; exit 1; }
ninja -C build -j"$(nproc)" mt_test_cuda > "$OUT/build.log" 2>&1 || { grep -A8 -E "error" "$OUT/build.log" | head -80; exit 1; }
t1=$(date +%s)
echo "build $((t1 - t0)) s"
timeout 120 ./build/test/mt_test_cuda -r compact "[moe]~[.bench]" > "$OUT/test.log" 2>&1
rc=$?
t2=$(date +%s)
echo "tests $((t2 - t1)) s (rc $rc)"
grep -E "failed|FAILED|error" "$OUT/test.log" | cut -c1-400 | head -30
tail -3 "$OUT/test.log"
timeout 120 ./build/test/mt_test_cuda "[.bench][moe]" > "$OUT/bench.log" 2>&1
grep -E "BENCH|error" "$OUT/bench.log" | cut -c1-200
t3=$(date +%s)
echo "bench $((t3 - t2)) s"
[ -f "$ref/torch_moe.py" ] && timeout 75 python3 benchmarks/kernels/bench_moe_torch.py "$ref" 2>&1 | tee "$OUT/torch.log" | grep -v Warning
echo "torch $(($(date +%s) - t3)) s"
