#!/usr/bin/env bash
# Installs the Debian 12 packages HMC builds, tests and demonstrates with. Idempotent.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git
  libboost-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev catch2
  iproute2 procps python3 locales
  libopenmpi-dev openmpi-bin libgloo-dev
  libucx-dev ucx-utils
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
