#!/usr/bin/env bash
# One command from a fresh Debian 12 machine: dependencies, build, the whole test suite.
# .ci/run calls this. Extra arguments go to ctest (e.g. -L unit, -R p2p).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/install-deps.sh"
"$here/scripts/build.sh"
cd "${BUILD_DIR:-$here/build}"
ctest --output-on-failure --timeout 600 "$@"
