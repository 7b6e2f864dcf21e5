#!/usr/bin/env bash
# Regenerates docs/configuration.md from the live table (hmc-probe --json), so the doc
# cannot drift from the code. Run after adding a setting: scripts/gen-config-doc.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"${BUILD_DIR:-$here/build}/bin/hmc-probe" --json | python3 "$here/scripts/config_doc.py" > "$here/docs/configuration.md"
