#!/usr/bin/env bash
# One command from a fresh Debian 12 machine: dependencies, build, then the demonstration:
# what HMC finds here (providers, devices, configuration), then ranks on this machine
# exchanging data over every path with the path matrix, reasons and measured figures.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/install-deps.sh"
"$here/scripts/build.sh"
bin=${BUILD_DIR:-$here/build}/bin
echo; echo "== hmc-probe: providers, devices, configuration"; echo
"$bin/hmc-probe"
echo; echo "== hmc-probe --local 3: three ranks, every pair measured (same-host paths)"; echo
"$bin/hmc-probe" --local 3 -b 16M -n 10
echo; echo "== two ranks forced onto tcp (HMC_PATH=tcp)"; echo
HMC_PATH=tcp "$bin/hmc-probe" --local 2 -b 16M -n 10
