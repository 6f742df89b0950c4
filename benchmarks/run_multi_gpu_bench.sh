#!/usr/bin/env bash
# Multi-GPU throughput of megatrain (scripts/launch_mpirun.sh: one process per GPU, NCCL), mock
# data, bf16 (fp32 master weights and gradients), one node.
#   usage: benchmarks/run_multi_gpu_bench.sh OUTDIR dp|layouts [REFERENCE.py]
#
# MODE dp: data-parallel scaling of gpt2-350m (micro-batch 16, sequence 1024) and llama-1b (8, 2048)
#   on 1, 2 and 4 GPUs, 4 micro-batches accumulated per step: global batch = micro x GPUs x 4, so
#   the gradient reduction (issued during the last micro-batch's backward) has to hide behind
#   compute. megatrain runs plain data parallelism (replicated Adam, no distributed optimizer), as
#   DDP does. Compared against PyTorch DDP in the same call: REFERENCE.py's own model, torch.compile,
#   SDPA attention, bf16 autocast, fused AdamW and clipping, and DDP as it builds it; the reference
#   has no gradient accumulation, so OUTDIR/torch_ddp_accum.py (written by this script) imports it
#   and adds accumulation the standard DDP way (ddp.no_sync() for the first 3 micro-batches, the
#   all-reduce overlapped with the last backward). Both sides: same model shape, micro-batch,
#   sequence, accumulation, GPUs and tokens per optimizer step; one torchrun per config and GPU
#   count (the reference cannot hold two compiled DDP models in one process). MT_BENCH_ACCUM=1
#   compares one micro-batch per step instead, against the reference's own loop, unchanged.
#   Scaling efficiency = tok/s(N) / (N x tok/s(1)), of megatrain and of DDP. MT_BENCH_DISTOPT=1 adds,
#   for every GPU count above 1, a megatrain row with the distributed optimizer (ZeRO-1: gradients
#   reduce-scattered, Adam on 1/N of the parameters, bf16 parameters all-gathered during the next
#   forward), compared against the same DDP run.
# MODE layouts: llama-3b (micro-batch 2, global batch 32 on 4 GPUs) and llama-7b (configs/llama-7b.yaml,
#   micro-batch 1, global batch 16 on 4 GPUs, sequence 4096); the global batch grows with the GPUs of the
#   layout (x 2 on 8), so that every GPU gets as many micro-batches as on 4. Layouts (GPUs = the product):
#     TP2xDP2      tensor 2, sequence parallel, data 2 (8 micro-batches per data rank)
#     PP2xDP2      pipeline 2 x virtual 2 (interleaved 1F1B), distributed optimizer, data 2
#     TP2xPP2      tensor 2, sequence parallel, pipeline 2 (16 micro-batches)
#     TP2xPP2xDP2  8 GPUs: tensor 2 + sequence parallel, pipeline 2 x virtual 2, data 2, distributed optimizer
#     TP8          8 GPUs: tensor 8, sequence parallel
#     DP8          8 GPUs: data 8, distributed optimizer (replicated Adam would not fit the 7B)
#   No recompute: `megatrain plan` puts the largest, llama-7b TP2xDP2, at 69 GiB of weights,
#   gradients, optimizer and activations per GPU (141 GiB on an H200). No PyTorch counterpart.
#   The 8-GPU issue's run: MT_BENCH_LAYOUTS="TP2xPP2xDP2 TP8 DP8" ... OUTDIR layouts on nvidia-h200-x8.
# MODE moecp (the expert / context issue): moe-64x-top8 (one micro-batch of 8 x 2048 per GPU and step) on 1 GPU and
#   with expert parallelism 2 and 4 (data = expert = GPUs, global batch 8 x GPUs): "scaling" is tokens/s over GPUs x
#   the 1-GPU run's; then llama-1b (configs/llama-1b-32k.yaml: micro-batch 1, one micro-batch per step) at
#   sequence 16384 on 1 GPU and at 65536 with context 4 on 4 GPUs (ring, and all-to-all): "MFU vs 1" is the MFU
#   over the 1-GPU row's. Rows CP2 / CP2A2A (sequence 32768 on 2 GPUs, the same 16384 tokens per GPU) are for a
#   machine of 2 GPUs. Rows EP1B / EP2B / EP4B are the same runs with model.moe_router_force_load_balancing (random
#   router logits, as Megatron-Core's benchmark option): every expert gets about as many tokens, so their scaling
#   measures the token exchanges rather than the imbalance of the learned routing, which collapses onto a few
#   experts within a few iterations on mock data. MT_BENCH_MOECP ("EP1 EP2 EP4 CP1 CP4 CP4A2A"; any of the rows
#   below) picks the rows.
# MODE parity (the expert / context issue's parity at the benchmark sizes): 10 iterations of each layout against
#   the 1-GPU run of the same model, per precision; the table gives the largest relative difference of the loss and
#   of the gradient norm over the iterations, and PASS when the loss is within 2% (bf16) / 1e-4 (fp32), the issue's
#   tolerances (the norm, the most sensitive number of a step, is shown beside it: MoE routing flips on near ties
#   and clipped steps move it more than the loss). Every run is deterministic (the 1-GPU reference repeats bit for
#   bit) and warms the learning rate up over the 10 iterations: with the benchmarks' 2, llama-1b at one 16K sequence
#   a step swung its loss by 2 and its norm from 10 to 119 within 4 iterations, where any rounding grows.
#   Models: moe-64x-top8 (global batch 32 of micro-batch 8: 4 micro-batches on one GPU) under EP2, EP4,
#   TP2 (SP) x EP2; llama-1b-32k at sequence 16384 (one sequence a step) under CP2 and CP4,
#   ring and all-to-all; llama-1b (micro-batch 4, sequence 2048) with FP8 tensorwise under TP2 (SP), bf16 only.
#   MT_BENCH_PARITY picks rows (default: those that fit the visible GPUs); MT_BENCH_PRECISIONS ("bf16 fp32").
#
# Tokens/s is the whole job's, TFLOP/s and MFU per GPU (6N + 12Lhs FLOPs a token, 989.4 TFLOP/s),
# peak GiB rank 0's, comm_exposed the ms per iteration rank 0's compute stream waited on
# communication (when the binary reports it); all averaged over the iterations after the warm-up.
# Environment (defaults): MT_BENCH_ITERS (dp 14, layouts 12), MT_BENCH_WARMUP (4: iterations left
# out of the averages), MT_BENCH_ACCUM (4), MT_BENCH_GPUS ("1 2 4"), MT_BENCH_CONFIGS (per mode),
# MT_BENCH_REF_GPUS (as MT_BENCH_GPUS: the GPU counts the reference runs at), MT_BENCH_DISTOPT (0),
# MT_BENCH_LAYOUTS ("TP2xDP2 PP2xDP2 TP2xPP2"), MT_BENCH_REF_STEPS (10) / MT_BENCH_REF_WARMUP (3)
# (timed / warm-up steps of the reference), MT_BENCH_DEADLINE_S (dp 450, layouts 510: seconds from
# the script's start, a build included; no run starts within 30 s of it and each is cut at it, so the
# table always comes out), MT_BENCH_RUN_CAP_S / MT_BENCH_REF_CAP_S (240 / 200: most seconds a run),
# MT_BENCH_BIN (build-bench/megatrain, built like run_gpu_bench.sh when missing), MT_BENCH_EXTRA
# (more --set arguments for every megatrain run). Files in OUTDIR: megatrain-NAME.{jsonl,log,err}
# (metrics, stdout, stderr), torch-NAME.{jsonl,log}, runs.tsv (seconds per run), table.txt.
set -euo pipefail
usage="usage: benchmarks/run_multi_gpu_bench.sh OUTDIR dp|layouts|moecp|parity [REFERENCE.py]"
out=${1:?$usage}
mode=${2:?$usage}
[[ $mode == dp || $mode == layouts || $mode == moecp || $mode == parity ]] || { echo "$usage" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
ref=${3:-}
[[ -z $ref || $ref == /* ]] || ref=$PWD/$ref
cd "$(dirname "$0")/.."
[[ -n $ref ]] || ref=$PWD/../shared/reference/torch_gpt.py
t0=$(date +%s)

if [[ $mode == dp ]]; then
  iters=${MT_BENCH_ITERS:-14} deadline=${MT_BENCH_DEADLINE_S:-450}
  read -ra configs <<<"${MT_BENCH_CONFIGS:-gpt2-350m llama-1b}"
elif [[ $mode == layouts ]]; then
  iters=${MT_BENCH_ITERS:-12} deadline=${MT_BENCH_DEADLINE_S:-510}
  read -ra configs <<<"${MT_BENCH_CONFIGS:-llama-3b llama-7b}"
elif [[ $mode == moecp ]]; then
  iters=${MT_BENCH_ITERS:-12} deadline=${MT_BENCH_DEADLINE_S:-540}
else
  iters=10 deadline=${MT_BENCH_DEADLINE_S:-540}  # parity: the issue's 10 iterations
fi
warm=${MT_BENCH_WARMUP:-4}
accum=${MT_BENCH_ACCUM:-4}
read -ra gpus <<<"${MT_BENCH_GPUS:-1 2 4}"
ref_gpus=" ${MT_BENCH_REF_GPUS:-${gpus[*]}} "  # GPU counts the reference runs at (dp mode)
read -ra layouts <<<"${MT_BENCH_LAYOUTS:-TP2xDP2 PP2xDP2 TP2xPP2}"
read -ra extra <<<"${MT_BENCH_EXTRA:-}"
ref_steps=${MT_BENCH_REF_STEPS:-10} ref_warm=${MT_BENCH_REF_WARMUP:-3}
((iters > warm)) || { echo "MT_BENCH_ITERS ($iters) must exceed MT_BENCH_WARMUP ($warm)" >&2; exit 2; }

export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on these machines
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bin=${MT_BENCH_BIN:-build-bench/megatrain}
if [[ ! -x $bin ]]; then
  echo "building $bin ..." >&2
  cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRAIN_CUDA_ARCHS=90 -DMEGATRAIN_TESTS=OFF >"$out/cmake.log"
  ninja -C build-bench megatrain >"$out/build.log"
  bin=build-bench/megatrain
fi
if [[ $bin == /* ]]; then export MEGATRAIN_BIN=$bin; else export MEGATRAIN_BIN=$PWD/$bin; fi
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || true
  "$MEGATRAIN_BIN" --version || true
  git describe --always --dirty 2>/dev/null || true
} >"$out/machine.txt" 2>&1
: >"$out/rows.tsv"
: >"$out/runs.tsv"

# Seconds a run may take: at most CAP, and never past the deadline (0: too late to start one).
budget() {
  local cap=$1 left=$((t0 + deadline - $(date +%s)))
  ((left >= 30)) || { echo 0; return; }
  echo $((left < cap ? left : cap))
}

# mt_run NAME NP ARGS...: megatrain on NP GPUs.
mt_run() {
  local name=$1 np=$2 secs t rc=0
  shift 2
  secs=$(budget "${MT_BENCH_RUN_CAP_S:-240}")
  if ((secs == 0)); then echo "megatrain $name: not started (deadline)" >&2; return; fi
  echo "megatrain $name on $np GPU(s) ..." >&2
  rm -f "$out/megatrain-$name.jsonl"
  t=$(date +%s)
  timeout -k 10 "$secs" scripts/launch_mpirun.sh -n "$np" -- train "$@" "${extra[@]}" \
    --set logging.metrics_file="$out/megatrain-$name.jsonl" >"$out/megatrain-$name.log" 2>"$out/megatrain-$name.err" || rc=$?
  printf 'megatrain-%s\t%s\t%s\n' "$name" "$(($(date +%s) - t))" "$rc" >>"$out/runs.tsv"
  ((rc == 0)) || echo "megatrain $name failed (rc $rc): $(grep -v '^+ mpirun' "$out/megatrain-$name.err" | tail -3 | tr '\n' ' ')" >&2
}

# ref_run CONFIG NP: the PyTorch reference (DDP when NP > 1) with the same accumulation.
ref_run() {
  local c=$1 np=$2 secs t rc=0 name="$1-dp$2"
  secs=$(budget "${MT_BENCH_REF_CAP_S:-200}")
  if ((secs == 0)); then echo "torch $name: not started (deadline)" >&2; return; fi
  echo "torch $name ..." >&2
  t=$(date +%s)
  if ((np == 1)); then
    PYTHONUNBUFFERED=1 timeout -k 10 "$secs" python3 "$out/torch_ddp_accum.py" "$ref" "$c" "$accum" "$ref_steps" "$ref_warm" \
      >"$out/torch-$name.jsonl" 2>"$out/torch-$name.log" || rc=$?
  else
    PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} timeout -k 10 "$secs" python3 -m torch.distributed.run \
      --standalone --nproc_per_node="$np" "$out/torch_ddp_accum.py" "$ref" "$c" "$accum" "$ref_steps" "$ref_warm" \
      >"$out/torch-$name.jsonl" 2>"$out/torch-$name.log" || rc=$?
  fi
  printf 'torch-%s\t%s\t%s\n' "$name" "$(($(date +%s) - t))" "$rc" >>"$out/runs.tsv"
  ((rc == 0)) || echo "torch $name failed (rc $rc): $(tail -2 "$out/torch-$name.log" | tr '\n' ' ')" >&2
}

source benchmarks/bench_common.sh
bench_set "$iters"  # BENCH_SET: the overrides every megatrain run here gets

if [[ $mode == dp ]]; then
  cat >"$out/torch_ddp_accum.py" <<'PY'
#!/usr/bin/env python3
"""The PyTorch reference with gradient accumulation (written by benchmarks/run_multi_gpu_bench.sh).
   usage: [torchrun --nproc_per_node=N] torch_ddp_accum.py REFERENCE.py CONFIG ACCUM STEPS WARMUP
Imports REFERENCE.py and uses its model, CONFIGS, torch.compile of the DDP-wrapped model, bf16
autocast, fused AdamW, clipping and timing; only the step changes: ACCUM micro-batches of the
config's micro-batch per optimizer step, the first ACCUM-1 under ddp.no_sync() (gradients stay
local), the last one all-reduces them overlapped with its backward. ACCUM 1 runs the reference's
own run() unchanged. Prints one JSON line (rank 0): tokens/s of the whole job, MFU per GPU."""
import contextlib, importlib.util, json, os, sys, time

ref_path, name = sys.argv[1], sys.argv[2]
accum, steps, warm = (int(a) for a in sys.argv[3:6])
spec = importlib.util.spec_from_file_location("torch_gpt_reference", ref_path)
R = importlib.util.module_from_spec(spec)
spec.loader.exec_module(R)
torch = R.torch


def run():
    c = R.CONFIGS[name]; torch.manual_seed(0)
    m = R.GPT(c).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(m, gradient_as_bucket_view=True) if R.WORLD > 1 else m
    N = sum(p.numel() for p in m.parameters()) - (m.pos.weight.numel() if m.pos is not None else 0)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, fused=True)
    f = torch.compile(ddp)
    B, T = c["mbs"], c["seq"]
    data = torch.randint(0, c["vocab"], (steps + warm, accum, B, T + 1), device="cuda")

    def step(i):
        for k in range(accum):
            local = R.WORLD > 1 and k < accum - 1
            with ddp.no_sync() if local else contextlib.nullcontext():
                with torch.autocast("cuda", torch.bfloat16):
                    loss = f(data[i, k, :, :-1], data[i, k, :, 1:])
                (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    for i in range(warm): step(i)
    torch.cuda.synchronize(); compile_s = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for i in range(warm, warm + steps): loss = step(i)
    e1.record(); torch.cuda.synchronize()
    dt = e0.elapsed_time(e1) / 1000 / steps
    tok = B * T * accum * R.WORLD / dt
    fpt = 6 * N + 12 * c["layers"] * c["hidden"] * T
    if R.RANK: return
    print(json.dumps(dict(config=name, compiled=True, gpus=R.WORLD, accum=accum, params_M=round(N / 1e6, 1), mbs=B, seq=T,
                          step_ms=round(dt * 1e3, 2), tokens_per_s=round(tok), tflops_per_gpu=round(tok * fpt / 1e12 / R.WORLD, 1),
                          mfu_pct=round(100 * tok * fpt / 1e12 / R.PEAK / R.WORLD, 1),
                          peak_mem_GiB=round(torch.cuda.max_memory_allocated() / 2**30, 1), warm_s=round(compile_s, 1),
                          loss=round(loss.item(), 3))), flush=True)


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = True
    if R.WORLD > 1:
        import torch.distributed as dist
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"])); dist.init_process_group("nccl")
    try:
        R.run(name) if accum == 1 else run()
    except Exception as e:
        print(json.dumps(dict(config=name, gpus=R.WORLD, accum=accum, rank=R.RANK, error=str(e)[:300])), flush=True)
        sys.exit(1)
    if R.WORLD > 1:
        dist.destroy_process_group()
PY
  declare -A mbs
  for c in gpt2-124m gpt2-350m llama-1b llama-3b; do mbs[$c]=${BENCH_MBS[$c]}; done  # the reference's DP configs
  if [[ ! -f $ref ]]; then echo "reference $ref not found: megatrain only" >&2; fi
  for c in "${configs[@]}"; do
    [[ -n ${mbs[$c]:-} ]] || { echo "dp mode knows no micro-batch for $c" >&2; continue; }
    for n in "${gpus[@]}"; do
      name=$c-dp$n
      printf '%s\t%s\tDP%s acc%s\t%s\n' "$name" "$c" "$n" "$accum" "$n" >>"$out/rows.tsv"
      mt_run "$name" "$n" --config "configs/$c.yaml" "${BENCH_SET[@]}" \
        --set training.micro_batch_size="${mbs[$c]}" --set training.global_batch_size=$((mbs[$c] * n * accum))
      if [[ -f $ref && $ref_gpus == *" $n "* ]]; then ref_run "$c" "$n"; fi
      if [[ ${MT_BENCH_DISTOPT:-0} == 1 ]] && ((n > 1)); then
        printf '%s\t%s\tDP%s acc%s distopt\t%s\t%s\n' "$name-distopt" "$c" "$n" "$accum" "$n" "$name" >>"$out/rows.tsv"
        mt_run "$name-distopt" "$n" --config "configs/$c.yaml" "${BENCH_SET[@]}" --set parallel.distributed_optimizer=true \
          --set training.micro_batch_size="${mbs[$c]}" --set training.global_batch_size=$((mbs[$c] * n * accum))
      fi
    done
  done
elif [[ $mode == moecp ]]; then
  # NAME CONFIG GPUS SEQUENCE ARGS: the rows of the expert / context runs (the sequence 0: the config's own).
  while read -r -u 3 l c np seq args; do  # fd 3: mpirun reads standard input
    [[ " ${MT_BENCH_MOECP:-EP1 EP2 EP4 CP1 CP4 CP4A2A} " == *" $l "* ]] || continue
    read -ra la <<<"$args"
    ((seq == 0)) || la+=(--set model.seq_length="$seq")
    mb=${BENCH_MBS[$c]:-1}
    [[ $c == moe-* ]] && la+=(--set training.micro_batch_size="$mb" --set training.global_batch_size=$((mb * np)))
    [[ $c == llama-1b-32k ]] && la+=(--set training.micro_batch_size=1 --set training.global_batch_size=1)
    # The config column groups a row with its 1-GPU row: EP rows by model, CP rows as one "llama-1b long" group.
    group=$c
    [[ $l == CP* ]] && group=llama-1b-long
    [[ $l == EP*B ]] && group=$c-balanced
    printf '%s\t%s\t%s\t%s\n' "$c-$l" "$group" "$l seq $((seq ? seq : 2048))" "$np" >>"$out/rows.tsv"
    mt_run "$c-$l" "$np" --config "configs/$c.yaml" "${BENCH_SET[@]}" "${la[@]}"
  done 3<<'ROWS'
EP1 moe-64x-top8 1 0
EP2 moe-64x-top8 2 0 --set parallel.expert=2
EP4 moe-64x-top8 4 0 --set parallel.expert=4
EP1B moe-64x-top8 1 0 --set model.moe_router_force_load_balancing=true
EP2B moe-64x-top8 2 0 --set parallel.expert=2 --set model.moe_router_force_load_balancing=true
EP4B moe-64x-top8 4 0 --set parallel.expert=4 --set model.moe_router_force_load_balancing=true
CP1 llama-1b-32k 1 16384
CP2 llama-1b-32k 2 32768 --set parallel.context=2 --set parallel.cp_comm_type=p2p
CP2A2A llama-1b-32k 2 32768 --set parallel.context=2 --set parallel.cp_comm_type=a2a
CP4 llama-1b-32k 4 65536 --set parallel.context=4 --set parallel.cp_comm_type=p2p
CP4A2A llama-1b-32k 4 65536 --set parallel.context=4 --set parallel.cp_comm_type=a2a
ROWS
elif [[ $mode == parity ]]; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c GPU || true)
  read -ra precisions <<<"${MT_BENCH_PRECISIONS:-bf16 fp32}"
  # What every row of a model sets: the batch (the same global batch in every layout) and the model's feature.
  declare -A model_args=(
    [moe-64x-top8]="--set training.global_batch_size=32"
    [llama-1b-32k]="--set model.seq_length=16384 --set training.global_batch_size=1"
    [llama-1b]="--set training.fp8=tensorwise --set training.micro_batch_size=4 --set training.global_batch_size=4")
  # NAME CONFIG GPUS ARGS; a model's 1-GPU row comes first and the rows after it compare with it.
  while read -r -u 3 l c np args; do
    if [[ -n ${MT_BENCH_PARITY:-} ]]; then
      [[ " $MT_BENCH_PARITY " == *" $l "* ]] || continue
    else
      ((np <= ngpu)) || continue
    fi
    read -ra la <<<"${model_args[$c]} $args"
    for p in "${precisions[@]}"; do
      [[ $l == FP8* && $p != bf16 ]] && continue  # FP8's GEMMs take bf16 operands
      printf '%s\t%s\t%s\t%s\n' "$l-$p" "$c" "$l" "$np" >>"$out/rows.tsv"
      mt_run "$l-$p" "$np" --config "configs/$c.yaml" "${BENCH_SET[@]}" "${la[@]}" --set training.precision="$p" \
        --set training.deterministic=true --set optimizer.warmup_iters=10
    done
  done 3<<'ROWS'
MOE1 moe-64x-top8 1
MOE-EP2 moe-64x-top8 2 --set parallel.expert=2
MOE-EP4 moe-64x-top8 4 --set parallel.expert=4
MOE-TP2SPxEP2 moe-64x-top8 4 --set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.expert=2
CP1 llama-1b-32k 1
CP2 llama-1b-32k 2 --set parallel.context=2 --set parallel.cp_comm_type=p2p
CP2A2A llama-1b-32k 2 --set parallel.context=2 --set parallel.cp_comm_type=a2a
CP4 llama-1b-32k 4 --set parallel.context=4 --set parallel.cp_comm_type=p2p
CP4A2A llama-1b-32k 4 --set parallel.context=4 --set parallel.cp_comm_type=a2a
FP8-1 llama-1b 1
FP8-TP2SP llama-1b 2 --set parallel.tensor=2 --set parallel.sequence_parallel=true
ROWS
else
  declare -A mbs=([llama-3b]=2 [llama-7b]=1) gbs4=([llama-3b]=32 [llama-7b]=16)
  declare -A layout_args=(
    [TP2xDP2]="--set parallel.tensor=2 --set parallel.sequence_parallel=true"
    [PP2xDP2]="--set parallel.pipeline=2 --set parallel.virtual_pipeline=2 --set parallel.distributed_optimizer=true"
    [TP2xPP2]="--set parallel.tensor=2 --set parallel.pipeline=2 --set parallel.sequence_parallel=true"
    [TP2xPP2xDP2]="--set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.pipeline=2 \
--set parallel.virtual_pipeline=2 --set parallel.distributed_optimizer=true"
    [TP8]="--set parallel.tensor=8 --set parallel.sequence_parallel=true"
    [DP8]="--set parallel.distributed_optimizer=true")
  for c in "${configs[@]}"; do
    for l in "${layouts[@]}"; do
      [[ -n ${layout_args[$l]:-} ]] || { echo "unknown layout $l (${!layout_args[*]})" >&2; continue; }
      read -ra la <<<"${layout_args[$l]}"
      np=1  # the product of the layout's sizes: TP2xPP2xDP2 -> 8
      for f in ${l//x/ }; do np=$((np * ${f//[A-Z]/})); done
      name=$c-$l
      printf '%s\t%s\t%s\t%s\n' "$name" "$c" "$l" "$np" >>"$out/rows.tsv"
      mt_run "$name" "$np" --config "configs/$c.yaml" "${BENCH_SET[@]}" "${la[@]}" \
        --set training.micro_batch_size="${mbs[$c]:-1}" --set training.global_batch_size=$((${gbs4[$c]:-16} * np / 4))
    done
  done
fi

python3 - "$out" "$mode" "$warm" <<'PY' | tee "$out/table.txt"
import json, math, os, sys

out, mode, warm = sys.argv[1], sys.argv[2], int(sys.argv[3])
nan = float("nan")

def jsonl(path):
    recs = []
    if os.path.exists(path):
        for line in open(path):
            try: recs.append(json.loads(line)) if line.startswith("{") else None
            except ValueError: pass
    return recs

def megatrain(name):  # means over the iterations after the warm-up, weighted by iteration time
    recs = [r for r in jsonl(os.path.join(out, f"megatrain-{name}.jsonl")) if "loss" in r and r["iteration"] > warm]
    if not recs: return None
    n = len(recs)
    ms = sum(r["ms_per_iter"] for r in recs) / n
    rate = lambda k: sum(r.get(k, nan) * r["ms_per_iter"] for r in recs) / n / ms
    s = dict(iters=n, ms=ms, tok=rate("tokens_per_s"), tf=rate("tflops_per_gpu"), mfu=100 * rate("mfu"),
             mem=max(r.get("mem_gib", nan) for r in recs), comm=None)
    if all("comm_exposed_ms" in r for r in recs): s["comm"] = sum(r["comm_exposed_ms"] for r in recs) / n
    return s

def reference(name):
    recs = jsonl(os.path.join(out, f"torch-{name}.jsonl"))
    return recs[0] if recs else {}

fmt = lambda v, spec, unit="": "-" if v is None or v != v else format(v, spec) + unit
rows = [l.rstrip("\n").split("\t") for l in open(os.path.join(out, "rows.tsv")) if l.strip()]
if mode == "parity":  # largest relative differences to the model's 1-GPU run of the same precision
    def curve(name):
        return {r["iteration"]: (r["loss"], r["grad_norm"])
                for r in jsonl(os.path.join(out, f"megatrain-{name}.jsonl")) if "loss" in r}
    rel = lambda a, b: abs(a - b) / max(abs(b), 1e-12)
    print("\nmegatrain multi-GPU parity: largest relative difference to 1 GPU over the iterations")
    print(f"{'config':<13} {'layout':<14} {'GPUs':>4} {'precision':<9} {'iters':>5} {'loss':>9} {'grad norm':>9}"
          "  verdict")
    base, verdicts = {}, []
    for name, config, layout, g in rows:
        prec = name.rsplit("-", 1)[1]
        c = curve(name)
        if g == "1":
            base[(config, prec)] = c
            print(f"{config:<13} {layout:<14} {g:>4} {prec:<9} {len(c):>5} {'-':>9} {'-':>9}  reference")
            continue
        b = base.get((config, prec), {})
        common = sorted(set(b) & set(c))
        tol = 0.02 if prec == "bf16" else 1e-4
        dl = max((rel(c[i][0], b[i][0]) for i in common), default=nan)
        dn = max((rel(c[i][1], b[i][1]) for i in common), default=nan)
        ok = len(common) == 10 and dl < tol
        verdicts.append(ok)
        print(f"{config:<13} {layout:<14} {g:>4} {prec:<9} {len(common):>5} {fmt(dl, '.1e'):>9} {fmt(dn, '.1e'):>9}  "
              + ("PASS" if ok else f"FAIL (loss tolerance {tol:g})"))
    print(f"{sum(verdicts)} of {len(verdicts)} layouts pass")
    sys.exit(0 if all(verdicts) else 1)
res = {r[0]: megatrain(r[0]) for r in rows}
# A row's reference run: its own name, or the 5th field (the distributed-optimizer rows share DDP's).
ref = {r[0]: reference(r[4] if len(r) > 4 else r[0]) if mode == "dp" else {} for r in rows}
one = {r[1]: ((res[r[0]] or {}).get("tok", nan), ref[r[0]].get("tokens_per_s", nan)) for r in rows if r[3] == "1"}
cols = [("config", "<10"), ("layout", "<20"), ("GPUs", ">4"), ("tokens/s", ">10"), ("TFLOP/s/GPU", ">11"),
        ("MFU/GPU", ">7"), ("peak GiB", ">8"), ("comm ms/it", ">10")]
if mode == "moecp":
    cols[0], cols[1] = ("config", "<13"), ("layout", "<18")
    cols += [("scaling", ">7"), ("MFU vs 1", ">8")]
if mode == "dp":
    cols += [("scaling", ">7"), ("DDP tok/s", ">10"), ("DDP MFU", ">7"), ("DDP GiB", ">7"), ("DDP scal.", ">9"), ("vs DDP", ">6")]
line = lambda cells: " ".join(format(str(c), spec) for c, (_, spec) in zip(cells, cols))
print(f"\nmegatrain multi-GPU benchmark ({mode}): means over the iterations after the first {warm}")
print(line([c for c, _ in cols]))
summary = []
for name, config, layout, g, *_ in rows:
    s, n, r = res[name] or {}, int(g), ref[name]
    cells = [config, layout, n, fmt(s.get("tok"), ",.0f"), fmt(s.get("tf"), ".1f"), fmt(s.get("mfu"), ".1f", "%"),
             fmt(s.get("mem"), ".1f"), fmt(s.get("comm"), ".1f")]
    row = dict(name=name, config=config, layout=layout, gpus=n, **s)
    if mode == "moecp":
        base = next((res[m] for m, c, _, g, *_ in rows if c == config and g == "1" and res[m]), {})
        eff = s.get("tok", nan) / (n * base["tok"]) if base and config.startswith("moe") else nan
        mfu = s.get("mfu", nan) / base["mfu"] if base and base.get("mfu") else nan
        cells += [fmt(eff, ".2f"), fmt(mfu, ".2f")]
        row.update(scaling=eff, mfu_vs_1=mfu)
    if mode == "dp":
        mt1, ref1 = one.get(config, (nan, nan))
        tok, rt = s.get("tok", nan), r.get("tokens_per_s", nan)
        eff = tok / (n * mt1) if mt1 == mt1 and mt1 else nan
        reff = rt / (n * ref1) if ref1 == ref1 and ref1 else nan
        ratio = tok / rt if rt == rt and rt else nan
        cells += [fmt(eff, ".2f"), "error" if "error" in r else fmt(rt, ",.0f"), fmt(r.get("mfu_pct", nan), ".1f", "%"),
                  fmt(r.get("peak_mem_GiB", nan), ".1f"), fmt(reff, ".2f"), fmt(ratio, ".2f")]
        row.update(scaling=eff, torch=r, torch_scaling=reff, ratio=ratio)
    print(line(cells))
    summary.append(row)
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1, default=str)
missing = [n for n, *_ in rows if res[n] is None]
if missing: print("no megatrain result for: " + ", ".join(missing) + " (see megatrain-NAME.err)")
PY
echo "total $(($(date +%s) - t0)) s; per run: $out/runs.tsv" >&2
