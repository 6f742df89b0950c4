#!/usr/bin/env bash
# checkpoint.async_save on one GPU: wall time of the same run (ITERS iterations of CONFIG, a checkpoint every
# INTERVAL iterations, keep_last 1) without checkpoints, with synchronous saves and with asynchronous ones.
#   usage: OUT=dir benchmarks/async_save_ab.sh BIN [CONFIG] [ITERS] [INTERVAL]
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=$1 CONFIG=${2:-llama-1b} ITERS=${3:-30} INTERVAL=${4:-10}
OUT=${OUT:-/tmp/mt_async}
mkdir -p "$OUT"
source benchmarks/bench_common.sh
bench_set "$ITERS"
mb=${BENCH_MBS[$CONFIG]:-8}
for v in none sync async; do
  ck=()
  case $v in
    none) ck=(--set checkpoint.dir=) ;;
    sync) ck=(--set checkpoint.dir=/tmp/mt_ck_$v --set checkpoint.async_save=false) ;;
    async) ck=(--set checkpoint.dir=/tmp/mt_ck_$v --set checkpoint.async_save=true) ;;
  esac
  rm -rf "/tmp/mt_ck_$v"
  t0=$(date +%s.%N)
  "$BIN" train --config "configs/$CONFIG.yaml" "${BENCH_SET[@]}" --set training.micro_batch_size="$mb" \
    --set training.global_batch_size=$((mb * 4)) --set checkpoint.save_interval="$INTERVAL" --set checkpoint.keep_last=1 \
    --set logging.metrics_file="$OUT/async-$v.jsonl" "${ck[@]}" >"$OUT/async-$v.log" 2>&1 || echo "$v failed"
  t1=$(date +%s.%N)
  # The training loop's span from the log's timestamps (1 s resolution): iteration 1's line to "training done".
  first=$(date -d "$(grep -m1 "iter 1/" "$OUT/async-$v.log" | cut -c2-20)" +%s)
  done_at=$(date -d "$(grep -m1 "training done" "$OUT/async-$v.log" | cut -c2-20)" +%s)
  echo "$v: wall $(printf '%.1f' "$(echo "$t1 - $t0" | bc)") s, iterations 1..$ITERS in $((done_at - first)) s (+-1), $(grep -c 'saved checkpoint' "$OUT/async-$v.log") checkpoints saved"
  rm -rf "/tmp/mt_ck_$v"
done
