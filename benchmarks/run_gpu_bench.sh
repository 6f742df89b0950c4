#!/usr/bin/env bash
# One-GPU throughput of megatrain against the PyTorch reference (torch.compile, SDPA flash
# attention, bf16 autocast, fused AdamW) on the same GPU in the same run: gpt2-124m, gpt2-350m,
# llama-1b, llama-3b with the reference's micro-batch and sequence length, one micro-batch per
# iteration, mock data, bf16. Prints one table (tokens/s, TFLOP/s, MFU, peak memory, ratio).
#   usage: benchmarks/run_gpu_bench.sh OUTDIR [REFERENCE.py] [CONFIGS...]
# REFERENCE.py defaults to ../shared/reference/torch_gpt.py (copy it next to the repo when the
# machine has no ../shared). MT_BENCH_ITERS (30) iterations, the first MT_BENCH_WARMUP (10) not timed;
# MT_BENCH_EXTRA: more overrides for every megatrain run (e.g. "--set training.attention_backend=own").
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: benchmarks/run_gpu_bench.sh OUTDIR [REFERENCE.py] [CONFIGS...]}
ref=${2:-../shared/reference/torch_gpt.py}
shift $(( $# >= 2 ? 2 : $# ))
configs=("$@")
((${#configs[@]})) || configs=(gpt2-124m gpt2-350m llama-1b llama-3b)
mkdir -p "$out"
iters=${MT_BENCH_ITERS:-30}
warm=${MT_BENCH_WARMUP:-10}
read -ra extra <<<"${MT_BENCH_EXTRA:-}"

if [ ! -x build-bench/megatrain ]; then
  cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRAIN_CUDA_ARCHS=90 -DMEGATRAIN_TESTS=OFF >"$out/cmake.log"
  ninja -C build-bench megatrain >"$out/build.log"
fi

source benchmarks/bench_common.sh
bench_set "$iters"
for c in "${configs[@]}"; do
  echo "megatrain $c ..." >&2
  build-bench/megatrain train --config "configs/$c.yaml" "${BENCH_SET[@]}" --set training.micro_batch_size="${BENCH_MBS[$c]}" \
    --set training.global_batch_size="${BENCH_MBS[$c]}" --set logging.metrics_file="$out/megatrain-$c.jsonl" "${extra[@]}" \
    >"$out/megatrain-$c.log" 2>&1 || echo "megatrain $c failed: $(tail -1 "$out/megatrain-$c.log")" >&2
done
echo "pytorch reference ..." >&2
PYTHONUNBUFFERED=1 python3 "$ref" "${configs[@]}" >"$out/torch.jsonl" 2>"$out/torch.log" || echo "reference failed" >&2

python3 - "$out" "$warm" "${configs[@]}" <<'PY'
import json, sys, os
out, warm, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ref = {}
for line in open(os.path.join(out, "torch.jsonl")):
    if line.startswith("{"):
        j = json.loads(line); ref[j.get("config")] = j
rows = []
print(f"{'config':<11} {'megatrain tok/s':>15} {'TFLOP/s':>8} {'MFU':>6} {'mem GiB':>8} | {'torch tok/s':>11} {'TFLOP/s':>8} {'MFU':>6} {'mem GiB':>8} | {'ratio':>6}")
for c in configs:
    path = os.path.join(out, f"megatrain-{c}.jsonl")
    recs = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    recs = [r for r in recs if "loss" in r and r["iteration"] > warm]
    r = ref.get(c, {})
    if recs:
        ms = sum(x["ms_per_iter"] for x in recs) / len(recs)
        tok = recs[0]["tokens_per_s"] * recs[0]["ms_per_iter"] / ms
        tf = sum(x["tflops_per_gpu"] for x in recs) / len(recs)
        mfu = 100 * sum(x["mfu"] for x in recs) / len(recs)
        mem = max(x["mem_gib"] for x in recs)
    else:
        tok = tf = mfu = mem = float("nan")
    rt = r.get("tokens_per_s", float("nan"))
    print(f"{c:<11} {tok:>15.0f} {tf:>8.1f} {mfu:>5.1f}% {mem:>8.1f} | {rt:>11.0f} {r.get('tflops_per_gpu', float('nan')):>8.1f} "
          f"{r.get('mfu_pct', float('nan')):>5.1f}% {r.get('peak_mem_GiB', float('nan')):>8.1f} | {tok / rt if rt == rt and rt else float('nan'):>6.2f}")
PY
