#!/usr/bin/env bash
# fp8fuse call: build, [fp8] GPU tests, per-op profile of one llama-3b run per recipe.
set -uo pipefail
cd "$(dirname "$0")"
T0=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRAIN_CUDA_ARCHS=90 >$OUT/cmake.log 2>&1
ninja -C build -j16 megatrain mt_test_cuda >$OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
T1=$(date +%s); echo "build $((T1-T0)) s"; which nsys; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 200 build/test/mt_test_cuda "[fp8]" >$OUT/test_fp8.log 2>&1; echo "test [fp8] rc $?"; tail -3 $OUT/test_fp8.log
T2=$(date +%s); echo "tests $((T2-T1)) s"
source benchmarks/bench_common.sh
bench_set ${PROF_ITERS:-4}
for r in ${RECIPES:-none tensorwise delayed blockwise}; do
  for c in ${CONFIGS:-llama-3b}; do
  mb=${BENCH_MBS[$c]}
  MT_OP_PROFILE=$OUT/prof-$c-$r.txt timeout 200 build/megatrain train --config configs/$c.yaml "${BENCH_SET[@]}" \
    --set training.micro_batch_size=$mb --set training.global_batch_size=$((mb*4)) --set training.fp8=$r \
    --set logging.metrics_file=$OUT/m-$c-$r.jsonl >$OUT/run-$c-$r.log 2>&1
  echo "== $c $r rc $? $(grep -o '"ms_per_iter":[0-9.]*' $OUT/m-$c-$r.jsonl | tr '\n' ' ') $(grep -o '"mem_gib":[0-9.]*' $OUT/m-$c-$r.jsonl | tail -1)"
  head -22 $OUT/prof-$c-$r.txt | cut -c1-150
  done
done
echo "total $(( $(date +%s)-T0 )) s"
