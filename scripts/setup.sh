#!/usr/bin/env bash
# Installs what megatrain needs on Debian 12 / Ubuntu (only the packages that are missing), then
# configures and builds it into build/. Usage: scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build pkg-config libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev catch2
      openmpi-bin libopenmpi-dev nlohmann-json3-dev libopenblas-dev zlib1g-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

[ "${1:-}" = "--no-build" ] && exit 0
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${MEGATRAIN_CMAKE_ARGS:-}
ninja -C build
echo "setup: built build/megatrain and build/megatrain-data"
