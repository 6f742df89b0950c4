#!/usr/bin/env bash
# Issue #19's GPU check, in one command on one GPU: builds megatrain, trains a small Llama (8 layers,
# hidden 512, seq 256, bf16) for 300 iterations on the King James Bible (GPT-2 BPE), exports the
# checkpoint to Hugging Face (bf16 and fp32), and compares transformers' AutoModelForCausalLM with
# megatrain on (a) the mean cross-entropy of a fixed batch (the last 16 x 256 + 1 tokens of the corpus,
# in the validation split) and (b) the greedy continuation of a prompt (benchmarks/hf_export_check.py).
# megatrain's loss on that batch: one training step at lr 0 from the checkpoint (checkpoint.finetune)
# on a dataset holding exactly that batch, global_batch_size 16: its iteration-1 loss.
#   usage: benchmarks/hf_export_gpu_check.sh [DATA_DIR]
#   DATA_DIR holds bible_text_document.{bin,idx} (megatrain-data preprocess of data/corpus/bible_kjv.jsonl)
#   and encoder.json / vocab.bpe (default .carry/hfval). Logs and results go to $OUT (default /tmp/hfval/out).
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-.carry/hfval}
OUT=${OUT:-/tmp/hfval/out}
W=/tmp/hfval
PROMPT=${PROMPT:-"And God said unto Moses"}
mkdir -p "$OUT" "$W"
rm -rf "$W/ckpt" "$W/ck0" "$W/hf32" "$W/hf16" "$W/cache" "$W/cache0"

if [ ! -x build/megatrain ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRAIN_CUDA_ARCHS=90 -DMEGATRAIN_TESTS=OFF >"$OUT/build.log" 2>&1
  ninja -C build megatrain >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
echo "== built ($(git rev-parse --short HEAD 2>/dev/null || echo '?')); $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"

MODEL=(--set model.arch=llama --set model.num_layers=8 --set model.hidden_size=512 --set model.num_attention_heads=8
       --set model.ffn_hidden_size=1408 --set model.seq_length=256 --set model.vocab_size=50257
       --set training.precision=bf16 --set training.device=cuda
       --set data.tokenizer_type=gpt2-bpe --set data.vocab_file=$D/encoder.json --set data.merge_file=$D/vocab.bpe)
t0=$(date +%s)
build/megatrain train --config configs/quickstart.yaml "${MODEL[@]}" \
  --set data.paths=[$D/bible_text_document] --set data.split=[98,2,0] --set data.cache_dir=$W/cache \
  --set training.micro_batch_size=16 --set training.global_batch_size=32 --set training.train_iters=300 \
  --set training.eval_interval=100 --set training.eval_iters=8 \
  --set optimizer.lr=1e-3 --set optimizer.min_lr=1e-4 --set optimizer.warmup_iters=30 \
  --set checkpoint.dir=$W/ckpt --set checkpoint.save_interval=0 --set checkpoint.keep_last=0 \
  --set logging.log_interval=25 --set logging.metrics_file=$OUT/train_metrics.jsonl >"$OUT/train.log" 2>&1 \
  || { tail -30 "$OUT/train.log"; exit 1; }
echo "== trained in $(( $(date +%s) - t0 )) s"; grep -E 'validation|run summary' "$OUT/train.log" | tail -6

python3 benchmarks/hf_export_check.py make-batch --bin $D/bible_text_document.bin --out $W/batch --seqs 16 --seq-len 256
build/megatrain train --config configs/quickstart.yaml "${MODEL[@]}" \
  --set data.paths=[$W/batch] --set data.split=[100,0,0] --set data.cache_dir=$W/cache0 \
  --set training.micro_batch_size=16 --set training.global_batch_size=16 --set training.train_iters=1 \
  --set training.eval_iters=0 --set optimizer.lr=0 --set optimizer.min_lr=0 --set optimizer.warmup_iters=0 \
  --set checkpoint.dir=$W/ck0 --set checkpoint.load=$W/ckpt/iter_0000300 --set checkpoint.finetune=true \
  --set logging.log_interval=1 --set logging.metrics_file=$W/lr0.jsonl >"$OUT/steps.log" 2>&1 \
  || { tail -30 "$OUT/steps.log"; exit 1; }
MT_LOSS=$(python3 -c "import json,sys; r=[json.loads(l) for l in open('$W/lr0.jsonl')]; assert r[0]['iteration']==1 and r[0]['lr']==0; print(repr(r[0]['loss']))")
echo "== megatrain loss on the batch (one step at lr 0): $MT_LOSS"

build/megatrain convert export --checkpoint $W/ckpt --output $W/hf32 --dtype fp32 >>"$OUT/steps.log" 2>&1
build/megatrain convert export --checkpoint $W/ckpt --output $W/hf16 --dtype bf16 >>"$OUT/steps.log" 2>&1
ls -la $W/hf32 $W/hf16 >>"$OUT/steps.log"; cp $W/hf16/config.json "$OUT/hf_config.json"
build/megatrain generate --checkpoint $W/ckpt --prompt "$PROMPT" --max-new-tokens 40 --temperature 0 \
  >"$OUT/megatrain_generate.txt" 2>>"$OUT/steps.log"
echo "== megatrain generate: $(cat "$OUT/megatrain_generate.txt")"

PYTHONUNBUFFERED=1 python3 benchmarks/hf_export_check.py check --hf-dir $W/hf32 --hf-dir-bf16 $W/hf16 \
  --batch $W/batch --seqs 16 --seq-len 256 --megatrain-loss "$MT_LOSS" --megatrain-text "$OUT/megatrain_generate.txt" \
  --prompt "$PROMPT" --max-new-tokens 40 --vocab-file $D/encoder.json --merge-file $D/vocab.bpe \
  --json "$OUT/result.json" 2>&1 | tee "$OUT/check.log"
