#!/usr/bin/env bash
# A/B timing of megatrain variants: every variant of every config runs ROUNDS times, interleaved
# (A B A B ...) so that clock drift hits all variants alike; prints per variant the mean ms/iteration and
# tokens/s (iterations after the first SKIP), exposed communication ms/iteration, peak memory, and the
# tokens/s ratio to the first variant.
#   usage: OUT=dir AB_CONFIGS="llama-1b gpt2-350m" benchmarks/gpu_ab.sh BIN base '--set=training.attention_backend=own' ...
#   env: AB_ITERS (10), AB_SKIP (3), AB_ROUNDS (2), AB_ACCUM (micro-batches per step and data-parallel
#        rank, 4), AB_EXTRA (more arguments for every run)
# A variant is a space-separated list of words: VAR=value (environment, e.g. NCCL_ALGO=Ring), --set=key=value (a config
# override), np=N (N processes, one per GPU, through scripts/launch_mpirun.sh; the global batch grows
# with N: pure data parallelism unless the variant sets the layout and the batch), bin=PATH (another megatrain
# binary, e.g. one built from an older commit), or "base" (none).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=$1
shift
OUT=${OUT:-/tmp/mt_ab}
mkdir -p "$OUT"
iters=${AB_ITERS:-10} skip=${AB_SKIP:-3} rounds=${AB_ROUNDS:-2} accum=${AB_ACCUM:-4}
source benchmarks/bench_common.sh
bench_set "$iters"
read -r -a configs <<<"${AB_CONFIGS:-llama-1b}"
for round in $(seq 1 "$rounds"); do
  for c in "${configs[@]}"; do
    v=0
    for variant in "$@"; do
      envs=() sets=() np=1 bin=$BIN
      for w in $variant; do
        case $w in
          base) ;;
          np=*) np=${w#np=} ;;
          bin=*) bin=${w#bin=} ;;
          --set=*) sets+=(--set "${w#--set=}") ;;
          *=*) envs+=("$w") ;;
        esac
      done
      mb=${BENCH_MBS[$c]:-8}
      launch=("$bin")
      ((np == 1)) || launch=(env MEGATRAIN_BIN="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")" scripts/launch_mpirun.sh -n "$np" --)
      # shellcheck disable=SC2086
      env "${envs[@]}" timeout 300 "${launch[@]}" train --config "configs/$c.yaml" "${BENCH_SET[@]}" \
        --set training.micro_batch_size="$mb" --set training.global_batch_size=$((mb * accum * np)) \
        --set logging.metrics_file="$OUT/ab-$c-$v-$round.jsonl" \
        "${sets[@]}" ${AB_EXTRA:-} >"$OUT/ab-$c-$v-$round.log" 2>&1 ||
        echo "variant $v ($variant) of $c failed: $(tail -1 "$OUT/ab-$c-$v-$round.log")" >&2
      v=$((v + 1))
    done
  done
done
python3 - "$OUT" "$skip" "$rounds" "${#configs[@]}" "${configs[@]}" "$@" <<'PY'
import json, math, os, sys
out, skip, rounds, nc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
configs, variants = sys.argv[5:5 + nc], sys.argv[5 + nc:]
def records(p):
    if not os.path.exists(p): return []
    rs = []
    for l in open(p):
        try: r = json.loads(l.replace("NaN", "null").replace("Infinity", "null"))
        except ValueError: continue
        if "ms_per_iter" in r and r["iteration"] > skip: rs.append(r)
    return rs
def mean(xs): return sum(xs) / len(xs) if xs else float("nan")
print(f"{'config':10} {'variant':48} {'ms/iter':>9} {'per round':>16} {'tok/s':>10} {'comm ms':>8} {'GiB':>6} "
      f"{'ratio':>6} {'loss@last':>10}")
for c in configs:
    base = None
    for v, name in enumerate(variants):
        per, tok, comm, mem, loss = [], [], [], 0.0, float("nan")
        for r in range(1, rounds + 1):
            rs = records(os.path.join(out, f"ab-{c}-{v}-{r}.jsonl"))
            if rs:
                per.append(mean([x["ms_per_iter"] for x in rs]))
                tok.append(mean([x["tokens_per_s"] for x in rs]))
                comm.append(mean([x.get("comm_exposed_ms", 0) for x in rs]))
                mem = max(mem, max(x.get("mem_gib", 0) for x in rs))
                loss = rs[-1].get("loss", float("nan"))
        t = mean(tok)
        if base is None: base = t
        print(f"{c:10} {name[:48]:48} {mean(per):9.1f} {' '.join(f'{x:.1f}' for x in per):>16} {t:10.0f} "
              f"{mean(comm):8.1f} {mem:6.1f} {t / base if t == t else float('nan'):6.3f} {loss:10.6f}")
PY
