#!/usr/bin/env bash
# NVIDIA's compute-sanitizer over the carried GPU tests (scripts/pack-gpu-carry.sh), on a
# machine with a GPU: memcheck with leak checking on the device suites, racecheck and
# synccheck on the device conformance kit (which launches every kernel of the cuda
# provider). The counterpart of scripts/sanitize.sh for code nvcc builds. Logs land in
# OUTDIR/<tool>/; the exit status is non-zero when any run failed or reported an error.
#
#   scripts/gpu-sanitize.sh OUTDIR        CARRY (default <repo>/.carry-gpu), SANITIZER
#                                         (default: compute-sanitizer on PATH or in CUDA)
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)
carry=${CARRY:-$root/.carry-gpu}
cs=${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
[ -x "$cs" ] || { echo "gpu-sanitize: no compute-sanitizer ($cs)" >&2; exit 2; }
[ -x "$carry/gpu-tests.sh" ] || { echo "gpu-sanitize: no carry folder at $carry (scripts/pack-gpu-carry.sh)" >&2; exit 2; }
export LD_LIBRARY_PATH=$carry/lib:$carry/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
"$carry/bin/hmc-bench" --help >/dev/null 2>&1 || export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$carry/deps/compat
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off
"$cs" --version | tail -1
failed=0
# run TOOL ONLY-REGEX SECONDS-PER-TEST [extra sanitizer options]
run() {
  local tool=$1 only=$2 cap=$3
  shift 3
  echo "-- $tool on /$only/"
  WRAP="$cs --tool $tool --error-exitcode 99 --target-processes all $*" ONLY=$only \
    bash "$carry/gpu-tests.sh" "$out/$tool" "$cap" || failed=1
}
run memcheck '^device\.cuda(\.one-queue)?$' 240 --leak-check full
run racecheck '^hmc-conformance-device-cuda$' 120
run synccheck '^hmc-conformance-device-cuda$' 120
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$out"/*/*.log | sort | uniq -c
exit $failed
