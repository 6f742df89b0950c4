#!/bin/bash
# GPU machine, one call (MoE speed session 10, final): moe_speed.sh with torch_moe_load.py standing in for the
# reference (torch_moe.py's model, data and timing, plus its routing load per layer outside the timed window), then
# the GPU tests of the allocator's block reuse and AdamW's fused compute copy.  usage: OUT=... moe_call2.sh
set -o pipefail
FINAL=${OUT:-/tmp/mt_out}
mkdir -p "$FINAL"
OUT="$FINAL/speed" benchmarks/kernels/moe_speed.sh benchmarks/kernels/torch_moe_load.py 25 2>&1 | tee "$FINAL/speed.txt"
timeout 60 ./build/test/mt_test_cuda -r compact "[allocator],[adamw]" > "$FINAL/test_extra.log" 2>&1
echo "== extra tests (rc $?):"; grep -E "failed|FAILED" "$FINAL/test_extra.log" | cut -c1-300 | head; tail -2 "$FINAL/test_extra.log"
