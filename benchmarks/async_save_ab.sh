#!/usr/bin/env bash
# checkpoint.async_save on one GPU: the same run (ITERS iterations of CONFIG, a checkpoint every INTERVAL iterations,
# keep_last 1) without checkpoints, with synchronous saves and with asynchronous ones.
#   usage: OUT=dir [VARIANTS="none sync async"] [CKPT_ROOT=/tmp] [GBS=N] benchmarks/async_save_ab.sh BIN [CONFIG] [ITERS] [INTERVAL]
# The batch is the benchmark micro-batch of CONFIG (benchmarks/bench_common.sh) with a global batch of 4 micro-batches,
# or GBS sequences per step when set (GBS=256 is llama-1b's shipped global batch).
# Per variant: the training loop's time (the trainer's "training loop:" line, iterations 1..ITERS including the
# saves' stalls; the last async checkpoint's write finishing after the loop is reported apart), the time the
# training thread spent in saves, and per checkpoint the background copy wait and write time, its size and the
# write rate (bytes / write seconds: hashing + writing + fsync). Iteration 1 (cuDNN/cuBLAS set-up) varies by
# seconds between processes, so the comparison line is the mean step time over iterations 2..ITERS (metrics
# file) plus the training thread's time in saves per iteration.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=$1 CONFIG=${2:-llama-1b} ITERS=${3:-30} INTERVAL=${4:-10}
OUT=${OUT:-/tmp/mt_async}
VARIANTS=${VARIANTS:-none sync async}
CKPT_ROOT=${CKPT_ROOT:-/tmp}
mkdir -p "$OUT"
source benchmarks/bench_common.sh
bench_set "$ITERS"
mb=${BENCH_MBS[$CONFIG]:-8}
gbs=${GBS:-$((mb * 4))}
base_loop=""
for v in $VARIANTS; do
  ck=()
  dir="$CKPT_ROOT/mt_ck_$v"
  case $v in
    none) ck=(--set checkpoint.dir=) ;;
    sync) ck=(--set checkpoint.dir="$dir" --set checkpoint.async_save=false) ;;
    async) ck=(--set checkpoint.dir="$dir" --set checkpoint.async_save=true) ;;
  esac
  rm -rf "$dir"
  t0=$(date +%s.%N)
  "$BIN" train --config "configs/$CONFIG.yaml" "${BENCH_SET[@]}" --set training.micro_batch_size="$mb" \
    --set training.global_batch_size="$gbs" --set checkpoint.save_interval="$INTERVAL" --set checkpoint.keep_last=1 \
    --set logging.metrics_file="$OUT/async-$v.jsonl" "${ck[@]}" >"$OUT/async-$v.log" 2>&1 || echo "$v failed"
  t1=$(date +%s.%N)
  size=$(du -sb "$dir" 2>/dev/null | cut -f1)
  loop=$(grep -m1 "training loop:" "$OUT/async-$v.log" | sed -E 's/.* in ([0-9.]+) s, of which ([0-9.]+) s.*/\1 \2/')
  read -r loop_s stall_s <<<"${loop:-nan nan}"
  [ "$v" = none ] && base_loop=$loop_s
  step=$(awk -F'"ms_per_iter": ' 'NF > 1 && !/"iteration": 1,/ { split($2, a, ","); s += a[1]; n++ } END { if (n) printf "%.2f", s / n }' "$OUT/async-$v.jsonl")
  per_it=$(awk -v st="$step" -v sv="$stall_s" -v n="$ITERS" 'BEGIN { printf "%.2f", st + 1000 * sv / (n - 1) }')
  [ "$v" = none ] && base_it=$per_it
  vs=$(awk -v a="$loop_s" -v b="$base_loop" 'BEGIN { if (b + 0 > 0 && a + 0 > 0) printf "%+.2f%%", 100 * (a / b - 1); else print "-" }')
  echo "$v: wall $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s, training loop (iterations 1..$ITERS) $loop_s s" \
    "($vs vs none), $stall_s s of it in saves, $(grep -c 'saved checkpoint' "$OUT/async-$v.log") checkpoints saved" \
    "(last one $(awk -v s="${size:-0}" 'BEGIN { printf "%.2f", s / 2^30 }') GiB)"
  echo "    step time iterations 2..$ITERS: $step ms; with the saves' stalls spread over them $per_it ms/iter" \
    "($(awk -v a="$per_it" -v b="${base_it:-0}" 'BEGIN { if (b > 0) printf "%+.2f%%", 100 * (a / b - 1); else print "-" }') vs none)"
  grep -E "snapshot|written in the background|still being written|page-locked" "$OUT/async-$v.log" | sed 's/^/    /'
  grep -oE "write [0-9.]+ s" "$OUT/async-$v.log" | awk -v s="${size:-0}" '{ if ($2 > 0) printf "    write rate %.2f GB/s (%.1f s for %.2f GB)\n", s / $2 / 1e9, $2, s / 1e9 }'
  rm -rf "$dir"
done
