#!/usr/bin/env bash
# FP8 speed work on one GPU, one device call: build, then benchmarks/fp8_gpu.sh (the [fp8] GPU tests and the bf16 /
# tensorwise / delayed / blockwise timings of llama-1b and llama-3b), then (time left) a per-op profile
# (MT_OP_PROFILE) of a short llama-3b run per recipe: where an FP8 step's time goes.
#   usage: OUT=dir benchmarks/fp8_profile.sh      env: PROF_ITERS (3), PROF_RECIPES, PROF_DEADLINE_S (560)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt_fp8prof}
mkdir -p "$OUT"
T0=$(date +%s)
if [ ! -x build/megatrain ] || [ ! -x build/test/mt_test_cuda ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRAIN_CUDA_ARCHS=90 >"$OUT/cmake.log" 2>&1
  ninja -C build -j16 megatrain mt_test_cuda >"$OUT/build.log" 2>&1 || { grep -B2 -A10 error "$OUT/build.log" | head -60; exit 1; }
fi
echo "build $(($(date +%s) - T0)) s; $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
OUT=$OUT benchmarks/fp8_gpu.sh build
echo "bench done at $(($(date +%s) - T0)) s"
source benchmarks/bench_common.sh
bench_set "${PROF_ITERS:-3}"
for r in ${PROF_RECIPES:-tensorwise delayed blockwise none}; do
  left=$((${PROF_DEADLINE_S:-560} - ($(date +%s) - T0)))
  ((left > 40)) || { echo "no time left for the $r profile"; break; }
  MT_OP_PROFILE="$OUT/prof-llama-3b-$r.txt" timeout "$left" build/megatrain train --config configs/llama-3b.yaml \
    "${BENCH_SET[@]}" --set training.micro_batch_size=4 --set training.global_batch_size=16 --set training.fp8="$r" \
    --set logging.metrics_file="$OUT/prof-llama-3b-$r.jsonl" >"$OUT/prof-llama-3b-$r.log" 2>&1
  echo "== profile llama-3b $r: rc $? $(grep -o '"ms_per_iter":[0-9.]*' "$OUT/prof-llama-3b-$r.jsonl" | tr '\n' ' ')"
  head -16 "$OUT/prof-llama-3b-$r.txt" | cut -c1-140
done
echo "total $(($(date +%s) - T0)) s"
