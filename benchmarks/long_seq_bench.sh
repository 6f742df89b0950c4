#!/usr/bin/env bash
# llama-1b at seq_length 32768 on one GPU (context 1, micro-batch 1, one micro-batch per step): megatrain
# (configs/llama-1b-32k.yaml) against the PyTorch reference given the same shape as a JSON config, in one call,
# with `megatrain plan`'s memory estimate. Prints one line per side and the ratios.
#   usage: OUT=dir benchmarks/long_seq_bench.sh BIN REFERENCE.py [ITERS] [SKIP]
# Megatrain: mean ms/iter over iterations SKIP+1..ITERS (default 8, 3), peak = the allocator's peak (metrics
# mem_gib). Reference: its own timing (20 steps after 5 warm-up steps, torch.compile), max_memory_allocated.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=$1 REF=$2 ITERS=${3:-8} SKIP=${4:-3}
OUT=${OUT:-/tmp/mt_longseq}
mkdir -p "$OUT"
source benchmarks/bench_common.sh
bench_set "$ITERS"
cfg=configs/llama-1b-32k.yaml
"$BIN" plan --world-size 1 --config "$cfg" --set training.global_batch_size=1 >"$OUT/plan.txt" 2>&1
# SM clock and power every 250 ms while each side runs (the GPU runs at its power limit here: clocks drop under load).
sample() { nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 250 >"$OUT/gpu-$1.csv" 2>/dev/null & }
sample megatrain; SAMPLER=$!
"$BIN" train --config "$cfg" "${BENCH_SET[@]}" --set training.micro_batch_size=1 --set training.global_batch_size=1 \
  --set logging.metrics_file="$OUT/megatrain-32k.jsonl" >"$OUT/megatrain-32k.log" 2>&1 || echo "megatrain failed: $(tail -2 "$OUT/megatrain-32k.log")"
kill "$SAMPLER" 2>/dev/null
shape='{"name":"llama-1b-32k","arch":"llama","layers":16,"hidden":2048,"heads":32,"kv_heads":8,"ffn":8192,"vocab":32000,"seq":32768,"mbs":1}'
sample reference; SAMPLER=$!
PYTHONUNBUFFERED=1 timeout "${REF_TIMEOUT:-240}" python3 "$REF" "$shape" >"$OUT/torch-32k.jsonl" 2>"$OUT/torch-32k.log" || echo "reference failed or timed out"
kill "$SAMPLER" 2>/dev/null
python3 - "$OUT" "$SKIP" <<'PY'
import json, os, re, sys
out, skip = sys.argv[1], int(sys.argv[2])
plan = open(os.path.join(out, "plan.txt")).read()
rows = [l.split() for l in plan.splitlines() if re.match(r"^\s+0\s+1\s+[0-9.]+\s", l)]
est = float(rows[0][9]) if rows else float("nan")  # "total none*"
recs = []
path = os.path.join(out, "megatrain-32k.jsonl")
if os.path.exists(path):
    recs = [json.loads(l) for l in open(path) if l.startswith("{")]
train = [r for r in recs if "loss" in r and "ms_per_iter" in r]
timed = [r for r in train if r["iteration"] > skip]
nan = float("nan")
ref = {}
for l in open(os.path.join(out, "torch-32k.jsonl")):
    if l.startswith("{"): ref = json.loads(l)
if timed:
    ms = sum(r["ms_per_iter"] for r in timed) / len(timed)
    tok = 32768 / (ms / 1e3)
    mem = max(r.get("mem_gib", nan) for r in train)
    tf = sum(r.get("tflops_per_gpu", nan) for r in timed) / len(timed)
    print(f"megatrain: {ms:.1f} ms/iter, {tok:.0f} tok/s, {tf:.1f} TFLOP/s, peak {mem:.2f} GiB, plan estimate {est:.2f} GiB "
          f"(peak/estimate {mem / est:.3f}), losses {[round(r['loss'], 4) for r in train]}")
else:
    tok = mem = nan
    print("megatrain: no timed iterations")
rt, rm = ref.get("tokens_per_s", nan), ref.get("peak_mem_GiB", nan)
print(f"reference: {json.dumps(ref)}")
print(f"ratio tokens/s {tok / rt:.3f}, peak memory megatrain {mem:.2f} vs reference {rm:.2f} GiB")
for side in ("megatrain", "reference"):  # samples under load (power above 300 W): median SM clock and power
    try:
        rows = [[float(x) for x in l.split(",")] for l in open(os.path.join(out, f"gpu-{side}.csv")) if l.strip()]
    except (OSError, ValueError):
        continue
    busy = sorted((r for r in rows if len(r) == 2 and r[1] > 300), key=lambda r: r[0])
    if busy:
        mhz, watts = busy[len(busy) // 2][0], sorted(r[1] for r in busy)[len(busy) // 2]
        print(f"{side}: median SM clock {mhz:.0f} MHz, power {watts:.0f} W over {len(busy)} samples under load")
PY
