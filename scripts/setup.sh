#!/usr/bin/env bash
# Installs what megatrain needs on Debian 12 / Ubuntu (only the packages that are missing), then
# configures and builds it into build/. Usage: scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/apt_install_missing.sh build-essential cmake ninja-build pkg-config libyaml-cpp-dev libspdlog-dev libfmt-dev \
  libcli11-dev catch2 openmpi-bin libopenmpi-dev nlohmann-json3-dev libopenblas-dev zlib1g-dev
[ "${1:-}" = "--no-build" ] && exit 0
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${MEGATRAIN_CMAKE_ARGS:-}
ninja -C build
echo "setup: built build/megatrain and build/megatrain-data"
