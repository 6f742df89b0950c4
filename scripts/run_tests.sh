#!/usr/bin/env bash
# The README's second command: install what is missing, build, run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure -j "${MT_TEST_JOBS:-2}"
