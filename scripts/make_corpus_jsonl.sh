#!/usr/bin/env bash
# Builds a real-text JSONL corpus from the King James Bible (Debian package bible-kjv, public
# domain): one document per chapter (1,189 documents, about 4.3 MB), each line
#   {"text": "Genesis 1\n1 In the beginning God created ...\n2 ...", "title": "Genesis 1"}
# Installs bible-kjv only when `bible` is missing. Idempotent: keeps an existing output file.
#   usage: scripts/make_corpus_jsonl.sh [OUT.jsonl]   (default data/corpus/bible_kjv.jsonl)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$top/data/corpus/bible_kjv.jsonl}
if [ -s "$out" ]; then
  echo "corpus already present: $out ($(wc -l <"$out") documents)"
  exit 0
fi
if ! command -v bible >/dev/null; then
  echo "installing Debian package bible-kjv ..." >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bible-kjv >&2
fi
mkdir -p "$(dirname "$out")"
bible -l0 'Gen1:1-Rev22:21' | python3 -c '
import json, sys
title, verses = None, []
def flush():
    if title is not None:
        doc = title + "\n" + "\n".join(verses)
        sys.stdout.write(json.dumps({"text": doc, "title": title}) + "\n")
for line in sys.stdin:
    line = line.rstrip("\n")
    if not line.strip():
        continue
    if not line.startswith(" "):      # a chapter heading: "Genesis 1"
        flush()
        title, verses = line.strip(), []
    else:
        verses.append(line.strip())
flush()
' >"$out.tmp"
mv "$out.tmp" "$out"
echo "corpus: $out ($(wc -l <"$out") documents, $(du -h "$out" | cut -f1))"
