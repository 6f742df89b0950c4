# Sourced by the benchmark scripts (after their `cd` to the repository root): what a timing run of megatrain
# on mock data is, in one place.
#   BENCH_MBS[config]   the micro-batch of each config: the PyTorch reference's (torch_gpt.py, torch_moe.py CONFIGS), so that
#                       both sides time the same work
#   bench_set ITERS     sets the array BENCH_SET to the overrides of such a run: GPU, bf16, mock data, ITERS
#                       iterations (2 of lr warm-up), no evaluation, no checkpoints, a log line and a metrics
#                       record every iteration; the caller adds the batch sizes and logging.metrics_file.
# shellcheck shell=bash disable=SC2034  # both variables are for the scripts that source this file
declare -A BENCH_MBS=([gpt2-124m]=32 [gpt2-350m]=16 [llama-1b]=8 [llama-3b]=4 [llama-7b]=1 [moe-8x-top2]=8 [moe-64x-top8]=8)
bench_set() {
  BENCH_SET=(--set training.device=cuda --set training.precision=bf16 --set data.mock=true
    --set training.train_iters="$1" --set optimizer.warmup_iters=2 --set training.eval_iters=0
    --set checkpoint.dir= --set logging.log_interval=1)
}
