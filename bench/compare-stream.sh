#!/usr/bin/env bash
# What stream ordering costs HMC's own collectives on device buffers, side by side in one run.
#
#   bench/compare-stream.sh [--build DIR] [--device cuda] [--ranks 2] [--colls "all_reduce all_gather"]
#                           [--range "-b 8 -e 256M -f 8"] [-z 0]
#
# For each collective, hmc-bench --local RANKS -g DEVICE (every rank on a device; with one
# GPU all ranks share it) in three modes, each its own run:
#   host      no stream: the host issues the calls and waits for them (the device path:
#             IPC between ranks of one host, reductions by device kernels);
#   staged    --stream with HMC_STREAM_STAGE=1 (the default): every call on a device stream,
#             its device buffers copied through registered host memory at the call, the
#             transfers and reductions on the host, the results copied back behind the
#             stream's wait (docs/architecture.md, "Stream ordering");
#   unstaged  --stream with HMC_STREAM_STAGE=0: on the stream, the device path as in host.
# HMC_CCL=off throughout: a collective delegated to NCCL runs on the stream by itself and
# stages nothing. -z 0 (default) issues the timed calls back to back as nccl-tests does.
# 20 timed calls after 20 warm-up calls made the same way: a burst of calls in flight on a
# stream grows the staging pool (registered host memory, HMC_STREAM_STAGE_MAX), which a job
# pays in its first steps only; with nccl-tests' 5 warm-up calls a 20-call burst grew it
# inside the timed part (0.5-1.4 against 1.9 GB/s on the emulator at 64 MiB).
# Results checked (-c 1) in every mode. Prints, per size, the time (us) and bus bandwidth
# (GB/s) of each mode, out of place. Every run has a deadline (RUN_TIMEOUT s, default 300).
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$src/build" device=cuda ranks=2 colls="all_reduce all_gather" range="-b 8 -e 256M -f 8" z=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --colls) colls=$2; shift 2 ;;
    --range) range=$2; shift 2 ;;
    -z) z=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "compare-stream: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bench="$build/bin/hmc-bench"
[ -x "$bench" ] || { echo "compare-stream: no $bench (build hmc-bench)" >&2; exit 2; }
scratch=$(mktemp -d "${TMPDIR:-/tmp}/compare-stream.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
run_timeout=${RUN_TIMEOUT:-300}

echo "# compare-stream: $(date -u +%FT%TZ), $(git -C "$src" describe --always --dirty 2>/dev/null || echo '?'), $ranks ranks on $device, -z $z, $range"
status=0
for coll in $colls; do
  for mode in host staged unstaged; do
    flags=() stage=1
    [ "$mode" != host ] && flags=(--stream)
    [ "$mode" = unstaged ] && stage=0
    # shellcheck disable=SC2086  # $range is a list of flags
    if ! HMC_CCL=off HMC_STREAM_STAGE=$stage timeout -k 10 "$run_timeout" "$bench" "$coll" --local "$ranks" -g "$device" \
         $range -n 20 -w 20 -z "$z" -c 1 --timeout "$run_timeout" --json "${flags[@]}" > "$scratch/$coll.$mode.json" 2> "$scratch/err"; then
      echo "compare-stream: $coll $mode failed:" >&2; tail -5 "$scratch/err" >&2; status=1
    fi
  done
  python3 - "$scratch" "$coll" <<'EOF' || status=1
import json, sys
scratch, coll = sys.argv[1:3]
modes = ["host", "staged", "unstaged"]
runs = {}
for m in modes:
    try:
        runs[m] = {r["size"]: r["out_of_place"] for r in json.load(open(f"{scratch}/{coll}.{m}.json"))["rows"]}
    except (OSError, ValueError, KeyError):
        runs[m] = {}
    wrong = sum(r.get("wrong") or 0 for r in runs[m].values())
    if wrong: print(f"# {coll} {m}: {wrong} wrong elements")
print(f"\n## {coll}, out of place: time us (busbw GB/s)\n")
print("| size | host | staged (stream) | unstaged (stream) | staged : host time |")
print("|---|---|---|---|---|")
for size in sorted(set().union(*[set(r) for r in runs.values()])):
    cells = []
    for m in modes:
        r = runs[m].get(size)
        cells.append(f"{r['time_us']:.1f} ({r['busbw_gbps']:.2f})" if r else "-")
    h, s = runs["host"].get(size), runs["staged"].get(size)
    ratio = f"{s['time_us'] / h['time_us']:.2f}x" if h and s and h["time_us"] > 0 else "-"
    print(f"| {size} | " + " | ".join(cells) + f" | {ratio} |")
EOF
done
exit $status
