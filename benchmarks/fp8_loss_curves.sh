#!/usr/bin/env bash
# FP8 loss curves on real text (issue #18), one GPU, one device call: llama-1b (its shape; GPT-2 BPE vocabulary,
# sequence 1024, 4 sequences per step) trained for ITERS iterations on the King James Bible under bf16 and each
# FP8 recipe (tensorwise, delayed, blockwise; format hybrid), the same seed and data order; validation every 100
# iterations. Prints the final validation loss of each against bf16's and writes the curves to $OUT/fp8_loss.png
# (scripts/plot_metrics.py).
#   usage: OUT=dir benchmarks/fp8_loss_curves.sh BIN [DATA_DIR] [ITERS]
#   DATA_DIR holds bible_text_document.{bin,idx} (megatrain-data preprocess of data/corpus/bible_kjv.jsonl with
#   the GPT-2 tokenizer) and encoder.json / vocab.bpe (default .carry/hfval).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?megatrain binary}
D=${2:-.carry/hfval}
ITERS=${3:-500}
OUT=${OUT:-/tmp/mt_fp8_loss}
mkdir -p "$OUT"
for r in none tensorwise delayed blockwise; do
  extra=()
  [ "$r" = delayed ] && extra=(--set training.fp8_amax_history_len=16 --set training.fp8_amax_compute_algo=max)
  "$BIN" train --config configs/llama-1b.yaml --set training.device=cuda --set training.precision=bf16 \
    --set training.fp8=$r --set training.fp8_format=hybrid "${extra[@]}" \
    --set model.vocab_size=50257 --set model.seq_length=1024 --set data.tokenizer_type=gpt2-bpe \
    --set data.vocab_file=$D/encoder.json --set data.merge_file=$D/vocab.bpe \
    --set data.paths=[$D/bible_text_document] --set data.split=[98,2,0] --set data.cache_dir=$OUT/cache-$r \
    --set training.micro_batch_size=4 --set training.global_batch_size=4 --set training.train_iters=$ITERS \
    --set training.eval_interval=100 --set training.eval_iters=10 --set optimizer.warmup_iters=50 \
    --set checkpoint.dir= --set logging.log_interval=50 --set logging.metrics_file=$OUT/fp8-$r.jsonl \
    >"$OUT/train-$r.log" 2>&1 || { echo "$r failed: $(tail -2 "$OUT/train-$r.log")"; continue; }
done
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def last_val(r):
    p = os.path.join(out, f"fp8-{r}.jsonl")
    if not os.path.exists(p): return None
    v = [json.loads(l) for l in open(p)]
    v = [x for x in v if x.get("val_loss") is not None]
    return v[-1]["val_loss"] if v else None
base = last_val("none")
print(f"{'recipe':<11} {'final validation loss':>22} {'vs bf16':>9}")
for r in ["none", "tensorwise", "delayed", "blockwise"]:
    v = last_val(r)
    rel = f"{100 * (v - base) / base:+.2f}%" if v is not None and base else "n/a"
    print(f"{r:<11} {v if v is not None else float('nan'):>22.4f} {rel:>9}")
PY
python3 scripts/plot_metrics.py "$OUT"/fp8-none.jsonl "$OUT"/fp8-tensorwise.jsonl "$OUT"/fp8-delayed.jsonl \
  "$OUT"/fp8-blockwise.jsonl --label bf16 --label tensorwise --label delayed --label blockwise \
  --title "llama-1b on the KJV Bible: bf16 and FP8 (hybrid)" --output "$OUT/fp8_loss.png" >/dev/null 2>&1 || echo "plot failed"
exit 0
