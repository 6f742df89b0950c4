#!/usr/bin/env bash
# The README's second command: installs what is missing, builds, fetches the tokenizer files and the
# test corpus, installs Slurm and munge (the Slurm end-to-end test) and matplotlib (the plotting test), and runs
# the whole test suite (the tokenizer and plotting tests then fail instead of skipping when what they need is absent).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_text_data.sh
# test/cli/slurm_train.sh starts a one-node Slurm cluster (as root) from these.
scripts/apt_install_missing.sh slurmctld slurmd slurm-client munge
scripts/apt_install_missing.sh python3-matplotlib   # test/observe runs scripts/plot_metrics.py
export MEGATRAIN_REQUIRE_TOKENIZER=1
ctest --test-dir build --output-on-failure -j "${MT_TEST_JOBS:-2}"
