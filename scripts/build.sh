#!/usr/bin/env bash
# Configures and builds HMC into ${BUILD_DIR:-build}. Jobs default to the core count.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$here/build}
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} >/dev/null
cmake --build "$build" -j "${BUILD_JOBS:-$(nproc)}"
