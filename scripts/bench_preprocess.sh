#!/usr/bin/env bash
# Preprocessing throughput and peak memory of `megatrain-data preprocess` (GPT-2 BPE, --append-eod)
# on a ~100 MB JSONL made by repeating the bible corpus: 1 worker, then every hardware thread.
# Each run is measured with /usr/bin/time -v (wall time, peak RSS); MB/s counts JSONL bytes.
#   usage: scripts/bench_preprocess.sh [BUILD_DIR] [TARGET_MB]   (defaults: build, 100)
# Needs the binary (ninja -C BUILD_DIR megatrain-data); fetches the GPT-2 files and builds the corpus
# when missing. Prints a markdown table for benchmarks/preprocess.md.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/build}
target_mb=${2:-100}
bin=$build/megatrain-data
[ -x "$bin" ] || { echo "error: $bin not found; build it: ninja -C $build megatrain-data" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "error: /usr/bin/time is missing (apt-get install -y time)" >&2; exit 1; }
"$top/scripts/fetch_gpt2_tokenizer.sh" >/dev/null
"$top/scripts/make_corpus_jsonl.sh" >/dev/null
corpus=$top/data/corpus/bible_kjv.jsonl
work=${MEGATRAIN_BENCH_DIR:-/tmp/megatrain-bench}
mkdir -p "$work"
input=$work/bible_x${target_mb}MB.jsonl
if [ ! -s "$input" ]; then
  : >"$input.tmp"
  while [ "$(stat -c %s "$input.tmp")" -lt $((target_mb * 1000000)) ]; do cat "$corpus" >>"$input.tmp"; done
  mv "$input.tmp" "$input"
fi
size=$(stat -c %s "$input")
gpt2=$top/data/tokenizers/gpt2
echo "input: $input ($(awk "BEGIN{printf \"%.1f\", $size/1e6}") MB, $(wc -l <"$input") documents); machine: $(nproc) hardware threads, $(uname -m)"
echo "commit: $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| workers | wall s | MB/s (wall) | MB/s (pipeline, after tokenizer load) | user+sys CPU s | peak RSS MB |"
echo "|---|---|---|---|---|---|"
for w in 1 $(nproc); do
  log=$work/time_w$w.txt
  /usr/bin/time -v "$bin" preprocess --input "$input" --tokenizer gpt2-bpe --vocab-file "$gpt2/encoder.json" \
    --merge-file "$gpt2/vocab.bpe" --append-eod --workers "$w" --output-prefix "$work/out_w$w" --log-interval 0 \
    >"$work/out_w$w.txt" 2>"$log"
  wall=$(grep "Elapsed (wall clock)" "$log" | awk '{print $NF}' | awk -F: '{ if (NF==3) print $1*3600+$2*60+$3; else print $1*60+$2 }')
  rss=$(grep "Maximum resident set size" "$log" | awk '{print $NF}')
  cpu=$(awk '/User time/ {u=$NF} /System time/ {s=$NF} END {print u+s}' "$log")
  pipe=$(grep -o '[0-9.]* MB/s' "$work/out_w$w.txt" | head -1 | cut -d' ' -f1)
  printf "| %s | %.2f | %.1f | %s | %.2f | %.0f |\n" "$w" "$wall" "$(awk "BEGIN{print $size/1e6/$wall}")" "$pipe" "$cpu" "$(awk "BEGIN{print $rss/1024}")"
done
cmp -s "$work/out_w1_text_document.bin" "$work/out_w$(nproc)_text_document.bin" &&
  cmp -s "$work/out_w1_text_document.idx" "$work/out_w$(nproc)_text_document.idx" &&
  echo && echo "outputs of 1 and $(nproc) workers are byte-identical"
rm -f "$work"/out_w*_text_document.*
