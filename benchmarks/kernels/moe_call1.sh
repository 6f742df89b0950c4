#!/bin/bash
# GPU machine, one call (MoE speed session 10, call 1): moe_speed.sh with torch_moe_load.py standing in for the
# reference (torch_moe.py's model, data and timing, plus the routing load per layer outside the timed window), the
# standalone cuBLAS / cuBLASLt expert GEMM timings (moe_lt_bench.cu), and megatrain on uniform random tokens (the
# reference's data; data.mock is a learnable Markov chain) to see whether the routing collapse comes from the data.
# usage: OUT=... moe_call1.sh
set -o pipefail
FINAL=${OUT:-/tmp/mt_out}
mkdir -p "$FINAL"
OUT="$FINAL/speed" benchmarks/kernels/moe_speed.sh benchmarks/kernels/torch_moe_load.py 25 2>&1 | tee "$FINAL/speed.txt"
t0=$(date +%s)
nvcc -O2 -std=c++17 -arch=sm_90 benchmarks/kernels/moe_lt_bench.cu -lcublasLt -lcublas -o build/moe_lt_bench &&
  timeout 90 build/moe_lt_bench > "$FINAL/lt_bench.txt" 2>&1
echo "lt bench $(($(date +%s) - t0)) s"; cat "$FINAL/lt_bench.txt" | cut -c1-110
python3 benchmarks/kernels/uniform_tokens.py /tmp/unif 1000000 32000
source benchmarks/bench_common.sh
bench_set 40
for c in moe-8x-top2 moe-64x-top8; do
  timeout 90 build/megatrain train --config "configs/$c.yaml" "${BENCH_SET[@]}" --set data.mock=false \
    --set 'data.paths=[/tmp/unif]' --set logging.metrics_file="$FINAL/unif-$c.jsonl" > "$FINAL/unif-$c.log" 2>&1 ||
    echo "uniform $c failed: $(tail -2 "$FINAL/unif-$c.log")"
  grep -oE "iter [0-9]+/|[0-9.]+ ms/iter|load max/mean [0-9.]+" "$FINAL/unif-$c.log" | paste -sd' ' | cut -c1-900
done
echo "call total $(($(date +%s) - t0)) s after moe_speed"
