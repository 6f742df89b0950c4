#!/usr/bin/env bash
# FP8 on one GPU (issue #18), for one device call after the build: the [fp8] GPU tests (casts vs the CPU emulation,
# FP8 GEMMs vs the dequantized fp64 GEMM), then tokens/s and peak memory of llama-1b and llama-3b under each recipe
# against megatrain bf16 (benchmarks/gpu_ab.sh: same binary, mock data, the ratio column is vs bf16).
#   usage: OUT=dir benchmarks/fp8_gpu.sh BUILD_DIR      env: AB_ITERS (8), AB_ROUNDS (1), FP8_CONFIGS
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
OUT=${OUT:-/tmp/mt_fp8}
mkdir -p "$OUT"
"$B/test/mt_test_cuda" "[fp8]" >"$OUT/test_cuda_fp8.log" 2>&1
echo "mt_test_cuda [fp8]: exit $?"
grep -E "fp8 block-scale layout|fp8_gemm|passed|failed|FAILED|with expansion|relative error" "$OUT/test_cuda_fp8.log" | head -60
OUT=$OUT/ab AB_CONFIGS=${FP8_CONFIGS:-"llama-1b llama-3b"} AB_ITERS=${AB_ITERS:-8} AB_SKIP=3 AB_ROUNDS=${AB_ROUNDS:-1} \
  benchmarks/gpu_ab.sh "$B/megatrain" base --set=training.fp8=tensorwise --set=training.fp8=delayed \
  --set=training.fp8=blockwise
for f in "$OUT"/ab/*.log; do
  grep -qiE "error|terminate" "$f" && { echo "== $f"; grep -iE "error|terminate" "$f" | head -3; }
done
exit 0
