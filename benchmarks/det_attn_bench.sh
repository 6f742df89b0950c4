#!/usr/bin/env bash
# llama-1b at seq_length 32768 on one GPU (configs/llama-1b-32k.yaml, micro-batch 1, one micro-batch per step) with
# training.deterministic true (cuDNN's deterministic attention backward, cut into KV groups or single query heads
# to bound its workspace: core/attention_chunks.h) against false (the shipped setting), and `megatrain plan`'s
# estimate of each. One line per run: mean ms/iter over iterations SKIP+1..ITERS, peak memory (metrics mem_gib).
#   usage: OUT=dir benchmarks/det_attn_bench.sh BIN [ITERS] [SKIP]
# Runs, in this order: deterministic true at the default cap (1024 MiB: single query heads, 2 GiB each), false,
# deterministic true with training.attention_bwd_workspace_mib 8192 (one KV group of 4 heads per call).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=$1 ITERS=${2:-6} SKIP=${3:-2}
OUT=${OUT:-/tmp/mt_det_attn}
mkdir -p "$OUT"
source benchmarks/bench_common.sh
bench_set "$ITERS"
cfg=configs/llama-1b-32k.yaml
runs=("det-1024:--set training.deterministic=true" "nondet:--set training.deterministic=false"
  "det-8192:--set training.deterministic=true --set training.attention_bwd_workspace_mib=8192")
for r in "${runs[@]}"; do
  name=${r%%:*}
  read -r -a extra <<<"${r#*:}"
  "$BIN" plan --world-size 1 --config "$cfg" --set training.global_batch_size=1 "${extra[@]}" >"$OUT/plan-$name.txt" 2>&1
  "$BIN" train --config "$cfg" "${BENCH_SET[@]}" --set training.micro_batch_size=1 --set training.global_batch_size=1 \
    "${extra[@]}" --set logging.metrics_file="$OUT/$name.jsonl" >"$OUT/$name.log" 2>&1 ||
    echo "$name failed: $(tail -2 "$OUT/$name.log")"
  python3 - "$OUT" "$name" "$SKIP" <<'PY'
import json, os, re, sys
out, name, skip = sys.argv[1], sys.argv[2], int(sys.argv[3])
plan = open(os.path.join(out, f"plan-{name}.txt")).read()
rows = [l.split() for l in plan.splitlines() if re.match(r"^\s+0\s+1\s+[0-9.]+\s", l)]
est = float(rows[0][9]) if rows else float("nan")  # "total none*"
ws = [l.strip() for l in plan.splitlines() if "attention backward workspace" in l or "warning:" in l]
path = os.path.join(out, f"{name}.jsonl")
recs = [json.loads(l) for l in open(path) if l.startswith("{")] if os.path.exists(path) else []
train = [r for r in recs if "loss" in r and "ms_per_iter" in r]
timed = [r for r in train if r["iteration"] > skip]
if timed:
    ms = sum(r["ms_per_iter"] for r in timed) / len(timed)
    mem = max(r.get("mem_gib", float("nan")) for r in train)
    print(f"{name}: {ms:.1f} ms/iter ({[round(r['ms_per_iter'], 1) for r in timed]}), {32768 / (ms / 1e3):.0f} tok/s, "
          f"peak {mem:.2f} GiB, plan {est:.2f} GiB, losses {[round(r['loss'], 4) for r in train]}")
else:
    print(f"{name}: no timed iterations")
for l in ws:
    print(f"  plan: {l}")
PY
done
