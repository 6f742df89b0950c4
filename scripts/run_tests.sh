#!/usr/bin/env bash
# The README's second command: installs what is missing, builds, fetches the tokenizer files and the
# test corpus (and matplotlib for the plotting test), and runs the whole test suite (the tokenizer and
# plotting tests then fail instead of skipping when what they need is absent).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_text_data.sh
scripts/apt_install_missing.sh python3-matplotlib   # test/observe runs scripts/plot_metrics.py
export MEGATRAIN_REQUIRE_TOKENIZER=1
ctest --test-dir build --output-on-failure -j "${MT_TEST_JOBS:-2}"
