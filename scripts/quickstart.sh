#!/usr/bin/env bash
# The README's first command: install what is missing, build, train the quickstart model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
build/megatrain train --config configs/quickstart.yaml "$@"
