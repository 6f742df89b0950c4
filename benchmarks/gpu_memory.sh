#!/usr/bin/env bash
# GPU machine, one call: single-GPU peak memory and step time of the llama configs (the memory work of
# 2026-11-22, RESULTS.md). Builds build-gpu (megatrain + mt_test_cuda; build-bench points at it), then
#   tests: mt_test_cuda, all non-bench cases (the changed ops first);
#   train: megatrain llama-1b and llama-3b as run_gpu_bench.sh runs them, with cuDNN's attention backward
#          in batch chunks (default) and in one piece (training.attention_bwd_workspace_mib: 65536);
#   bench REFERENCE.py: run_gpu_bench.sh (megatrain and the PyTorch reference) on llama-1b and llama-3b;
#   gpt2: megatrain gpt2-124m and gpt2-350m (no reference), while time is left;
#   ab: llama-1b with 4, 2 and 1 attention-backward batch chunks, interleaved, twice, while time is left.
# Logs packed into $OUT/logs.tgz; a table of ms/iteration, tokens/s and peak GiB printed last.
#   usage: benchmarks/gpu_memory.sh OUT "tests train" | "bench gpt2 ab" [REFERENCE.py]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: benchmarks/gpu_memory.sh OUT STEPS [REFERENCE.py]}
steps=${2:-"tests train"}
ref=${3:-.carry/torch_gpt.py}
L=/tmp/mt_mem/logs
mkdir -p "$L" "$out"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader >"$L/gpu.txt" 2>&1
# Always through ninja: a warm machine keeps build-gpu from the last call, older than the tree sent now.
{ [ -f build-gpu/build.ninja ] ||
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRAIN_CUDA_ARCHS=90 >"$L/cmake.log" 2>&1; } &&
  ninja -C build-gpu megatrain mt_test_cuda >"$L/build.log" 2>&1 ||
  { grep -B2 -A12 -E "error" "$L/build.log" | head -80; tar czf "$out/logs.tgz" -C /tmp/mt_mem logs; exit 1; }
mkdir -p build-bench && ln -sf ../build-gpu/megatrain build-bench/megatrain
echo "build: $(($(date +%s) - t0)) s" | tee -a "$L/times.txt"

source benchmarks/bench_common.sh
bench_set 30
train() {  # train TAG CONFIG [--set KEY=VALUE...]
  local tag=$1 c=$2
  shift 2
  build-gpu/megatrain train --config "configs/$c.yaml" "${BENCH_SET[@]}" \
    --set training.micro_batch_size="${BENCH_MBS[$c]}" --set training.global_batch_size="${BENCH_MBS[$c]}" \
    --set logging.metrics_file="$L/$tag.jsonl" "$@" >"$L/$tag.log" 2>&1 || echo "$tag failed: $(tail -2 "$L/$tag.log")"
  echo "$tag: $(($(date +%s) - t0)) s" >>"$L/times.txt"
}

for step in $steps; do
  case $step in
    tests)
      timeout 120 build-gpu/test/mt_test_cuda -r compact "[linear_swiglu],[attention],[attention_fused]" \
        >"$L/test_changed.log" 2>&1
      echo "tests (changed ops): rc $? $(tail -1 "$L/test_changed.log")"
      timeout 180 build-gpu/test/mt_test_cuda -r compact >"$L/test_all.log" 2>&1
      echo "tests (all): rc $? $(tail -1 "$L/test_all.log")"
      echo "tests: $(($(date +%s) - t0)) s" >>"$L/times.txt"
      ;;
    train)
      train mt-llama-1b llama-1b
      train mt-llama-3b llama-3b
      train mt-llama-1b-unchunked llama-1b --set training.attention_bwd_workspace_mib=65536
      train mt-llama-3b-unchunked llama-3b --set training.attention_bwd_workspace_mib=65536
      ;;
    ab)  # llama-1b with the attention backward in 4, 2 and 1 batch chunks (workspace cap 512, 1024, 65536 MiB), twice
      for rep in 1 2; do
        for cap in 512 1024 65536; do
          (($(date +%s) - t0 < ${DEADLINE_S:-520} - 40)) &&
            train "ab-llama-1b-cap$cap-$rep" llama-1b --set training.attention_bwd_workspace_mib=$cap
        done
      done
      ;;
    gpt2)  # megatrain only, while at least 80 s of the call's budget (DEADLINE_S, default 520) are left
      for c in gpt2-124m gpt2-350m; do
        (($(date +%s) - t0 < ${DEADLINE_S:-520} - 80)) && train "mt-$c" "$c"
      done
      ;;
    bench)
      timeout 420 bash benchmarks/run_gpu_bench.sh "$L/bench" "$ref" llama-1b llama-3b >"$L/bench_table.txt" \
        2>"$L/bench.err" || echo "benchmark rc $?"
      echo "bench: $(($(date +%s) - t0)) s" >>"$L/times.txt"
      ;;
  esac
done

tar czf "$out/logs.tgz" -C /tmp/mt_mem logs
cat "$L/times.txt" "$L/gpu.txt"
python3 - "$L" <<'PY'
import glob, json, os, sys
L = sys.argv[1]
print(f"{'run':<24} {'ms/it':>8} {'tok/s':>8} {'peak GiB':>9}")
for path in sorted(glob.glob(os.path.join(L, "*.jsonl"))):
    recs = [json.loads(l) for l in open(path) if l.startswith("{")]
    recs = [r for r in recs if "loss" in r and r["iteration"] > 10]
    if not recs:
        continue
    ms = sum(r["ms_per_iter"] for r in recs) / len(recs)
    tok = recs[0]["tokens_per_s"] * recs[0]["ms_per_iter"] / ms
    print(f"{os.path.basename(path)[:-6]:<24} {ms:>8.1f} {tok:>8.0f} {max(r['mem_gib'] for r in recs):>9.2f}")
PY
[ -f "$L/bench_table.txt" ] && cat "$L/bench_table.txt"
exit 0
