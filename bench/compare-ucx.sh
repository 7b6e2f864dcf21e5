#!/usr/bin/env bash
# HMC over its ucx provider against ucx_perftest, side by side, in one go.
#
#   bench/compare-ucx.sh [--build DIR] [--tls "tcp shm"] [--sizes "8 64K 4M"]
#
# For each UCX transport set (UCX_TLS) and size, on this machine:
#   HMC     hmc-probe --local 2 -b SIZE, forced onto ucx (HMC_PROVIDERS=cpu,ucx,
#           HMC_PATH=ucx): one-way bandwidth of SIZE-byte send/recv messages
#           (4 in flight, as hmc-probe measures) and half the round trip of 8 B;
#   UCX     ucx_perftest ucp_put_bw -s SIZE (one-way put bandwidth, its own
#           ucp_mem_map'd buffers) and tag_lat -s 8 (half a round trip), server
#           and client on 127.0.0.1; for reference also tag_bw -s SIZE, UCX's own
#           two-sided bandwidth (tagged send/recv, same buffers).
# HMC's buffers come from Context::alloc; with ucx the only net provider they
# come from its mem_alloc (ucp_mem_map ALLOCATE), as ucx_perftest's do.
# Each measurement runs REPEAT times (default 5), the programs taking turns; the
# table has the median of each. GB/s = 1e9 B/s (ucx_perftest's MB/s are MiB/s and
# are converted). Every run has a deadline (RUN_TIMEOUT s, default 120) and is
# reaped. Environment: REPEAT, ITERS (bandwidth messages, default 200; 4M: 50),
# LAT_ITERS (default 2000).
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$src/build"
tls_list="tcp shm"
sizes="8 64K 4M"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --tls) tls_list=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "compare-ucx: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
repeat=${REPEAT:-5} iters=${ITERS:-200} lat_iters=${LAT_ITERS:-2000} run_timeout=${RUN_TIMEOUT:-120}
probe="$build/bin/hmc-probe"
for tool in "$probe" "$(command -v ucx_perftest || true)"; do
  [ -x "$tool" ] || { echo "compare-ucx: missing $tool (build hmc-probe; apt install ucx-utils)" >&2; exit 2; }
done
[ -e "$build/lib/libhmc-net-ucx.so" ] || { echo "compare-ucx: $build/lib/libhmc-net-ucx.so not built" >&2; exit 2; }

scratch=$(mktemp -d "${TMPDIR:-/tmp}/compare-ucx.XXXXXX")
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$scratch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bytes_of() { numfmt --from=iec "$1"; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

# hmc SIZE TLS -> "GBps lat_us" of the 0->1 pair
hmc() {
  local n=$iters
  [ "$(bytes_of "$1")" -ge 1048576 ] && n=$(( iters / 4 ))
  UCX_TLS=$2 HMC_PROVIDERS=cpu,ucx HMC_PATH=ucx timeout "$run_timeout" \
    "$probe" --local 2 --timeout "$run_timeout" -b "$1" -n "$n" --lat-iters "$lat_iters" > "$scratch/hmc" 2>&1 || {
    echo "compare-ucx: hmc-probe failed:" >&2; cat "$scratch/hmc" >&2; return 1; }
  awk '$1 == "0" && $2 == "1" && $5 == "ucx" { print $6, $7; found = 1 } END { exit !found }' "$scratch/hmc" || {
    echo "compare-ucx: no ucx pair in hmc-probe's output:" >&2; cat "$scratch/hmc" >&2; return 1; }
}

# perftest TLS TEST SIZE ITERS -> the "Final:" line's fields
perftest() {
  local port=$(( 20000 + RANDOM % 20000 ))
  UCX_TLS=$1 timeout "$run_timeout" ucx_perftest -p "$port" > "$scratch/srv" 2>&1 &
  server=$!
  sleep 0.5
  UCX_TLS=$1 timeout "$run_timeout" ucx_perftest 127.0.0.1 -p "$port" -t "$2" -s "$3" -n "$4" > "$scratch/cli" 2>&1 || true
  wait "$server" 2>/dev/null || true
  server=""
  awk '/^Final:/ { print; found = 1 } END { exit !found }' "$scratch/cli" || {
    echo "compare-ucx: ucx_perftest $2 failed:" >&2; cat "$scratch/cli" "$scratch/srv" >&2; return 1; }
}

echo "compare-ucx: $(ucx_info -v | head -1 | sed 's/^# //'), $(nproc) cores, $(uname -r); median of $repeat runs"
printf "%-5s %6s | %12s %12s %6s | %10s %10s %6s | %11s\n" UCX_TLS size "HMC GB/s" "put_bw GB/s" ratio \
  "HMC lat us" "tag_lat us" ratio "tag_bw GB/s"
for tls in $tls_list; do
  for size in $sizes; do
    b=$(bytes_of "$size")
    n=$iters
    [ "$b" -ge 1048576 ] && n=$(( iters / 4 ))
    : > "$scratch/hb"; : > "$scratch/hl"; : > "$scratch/ub"; : > "$scratch/ul"; : > "$scratch/tb"
    for ((i = 0; i < repeat; i++)); do
      read -r gbps lat < <(hmc "$size" "$tls")
      echo "$gbps" >> "$scratch/hb"; echo "$lat" >> "$scratch/hl"
      # Final: iters p50 avg overall bw_avg bw_overall rate_avg rate_overall (MB/s = MiB/s)
      perftest "$tls" ucp_put_bw "$b" "$(( n * 10 ))" | awk '{ print $7 * 1048576 / 1e9 }' >> "$scratch/ub"
      perftest "$tls" tag_bw "$b" "$(( n * 10 ))" | awk '{ print $7 * 1048576 / 1e9 }' >> "$scratch/tb"
      [ "$size" = "${sizes%% *}" ] && perftest "$tls" tag_lat 8 "$lat_iters" | awk '{ print $4 }' >> "$scratch/ul"
    done
    hb=$(median < "$scratch/hb"); ub=$(median < "$scratch/ub"); tb=$(median < "$scratch/tb")
    if [ -s "$scratch/ul" ]; then
      hl=$(median < "$scratch/hl"); ul=$(median < "$scratch/ul")
      lat_cols=$(awk -v h="$hl" -v u="$ul" 'BEGIN { printf "%10.1f %10.1f %5.2fx", h, u, h / u }')
    else
      lat_cols=$(printf "%10s %10s %6s" "" "" "")
    fi
    printf "%-5s %6s | %12.4f %12.4f %5.0f%% | %s | %11.4f\n" "$tls" "$size" "$hb" "$ub" \
      "$(awk -v h="$hb" -v u="$ub" 'BEGIN { print 100 * h / u }')" "$lat_cols" "$tb"
  done
done
echo "HMC: hmc-probe --local 2 -b SIZE -n ITERS over ucx (send/recv: eager up to HMC_EAGER_LIMIT, then rendezvous put);"
echo "UCX: ucx_perftest -t ucp_put_bw -s SIZE, -t tag_lat -s 8 (latency row: 8 B, at the first size), -t tag_bw -s SIZE."
