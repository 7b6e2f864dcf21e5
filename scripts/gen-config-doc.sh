#!/usr/bin/env bash
# Regenerates docs/configuration.md from the live table (hmc-probe --json), so the doc
# cannot drift from the code. Run after adding a setting: scripts/gen-config-doc.sh
# (in a build with every provider, CUDA and UCX included: config_doc.py refuses otherwise).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"${BUILD_DIR:-$here/build}/bin/hmc-probe" --json | python3 "$here/scripts/config_doc.py" > "$out"
chmod 644 "$out"
mv "$out" "$here/docs/configuration.md"
trap - EXIT
