#!/usr/bin/env bash
# HMC over its ucx provider against ucx_perftest, side by side, in one go.
#
#   bench/compare-ucx.sh [--build DIR] [--tls "tcp shm"] [--sizes "8 64K 4M"]
#
# For each UCX transport set (UCX_TLS) and size, on this machine:
#   HMC     hmc-probe --local 2 -b SIZE, forced onto ucx (HMC_PROVIDERS=cpu,ucx,
#           HMC_PATH=ucx): one-way bandwidth of SIZE-byte send/recv messages
#           (4 in flight, as hmc-probe measures; eager up to the eager limit the
#           pair uses, printed, then rendezvous) and half the round trip of 8 B,
#           waited for with Request::wait and (--lat-poll) polled with Request::test;
#           with --rotate the same stream, the 4 messages in flight each from and
#           into a buffer of their own (as a pipeline's; ucx_perftest, like osu_bw,
#           moves every message from and into one buffer);
#           and with --put the bandwidth of one-sided puts (Communicator::put,
#           4 in flight, into the peer's registered buffer): what ucp_put_bw does;
#           and with --put --notify the same puts each carrying a notification
#           the target takes in order: the least any two-sided transfer does;
#   UCX     ucx_perftest, server and client on 127.0.0.1, its own ucp_mem_map'd
#           buffers: ucp_put_bw -s SIZE (one-way puts, no synchronisation per
#           message: the issue's reference), tag_bw -s SIZE (UCX's own two-sided
#           bandwidth, tagged send/recv; again with -e, endpoints with peer failure
#           handling, as HMC's: UCX then moves a tcp rendezvous as fragments the
#           receiver copies), tag_lat -s 8 and ucp_am_lat -s 8 (half a round trip;
#           HMC's messages are UCP active messages).
#   OMPI    Open MPI over the same UCX (pml ucx, UCX_TLS alike), bench/mpi_p2p.c built
#           with mpicc for the run: a stream of SIZE-byte MPI_Isend/MPI_Irecv, 4 in
#           flight, every message from and into one malloc'd buffer (as hmc-probe's
#           default stream), and an 8 B ping-pong: what a mature library's two-sided
#           transfers get from this UCX. Left out (columns "-") without mpicc/mpirun
#           or with OMPI=0.
# Both sides run the same number of messages (ITERS, default 20000 below 1 MiB,
# ITERS_LARGE, default 1000, from 1 MiB); ucx_perftest warms up with its default
# 10000, hmc-probe with a tenth of its count. For the latency both warm up with
# WARMUP round trips (default 10000, ucx_perftest's own default; ucx_perftest -w,
# hmc-probe --lat-warmup). On two vCPUs run nothing else meanwhile: a process that
# takes one of them halves what the ranks get (docs/performance.md, "Measuring on
# two vCPUs").
# HMC's buffers come from Context::alloc; with ucx the only net provider they
# come from its mem_alloc (ucp_mem_map ALLOCATE), as ucx_perftest's do.
# Each measurement runs REPEAT times (default 5), the programs taking turns; the
# table has the median of each. A round's programs run back to back, and every ratio is
# the median of the rounds' ratios, so that a VM whose speed changes from one minute to
# the next does not set one round's figure over another's (each round's figures follow
# the table). GB/s = 1e9 B/s (ucx_perftest's MB/s are MiB/s and are converted). Every
# run has a deadline (RUN_TIMEOUT s, default 120) and is reaped. Environment: REPEAT,
# ITERS, ITERS_LARGE, LAT_ITERS (default 20000), WARMUP, OMPI.
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
repeat=${REPEAT:-5} iters=${ITERS:-20000} iters_large=${ITERS_LARGE:-1000} lat_iters=${LAT_ITERS:-20000}
warmup=${WARMUP:-10000}
run_timeout=${RUN_TIMEOUT:-120}
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

mpi_bin=""
if [ "${OMPI:-1}" = 0 ]; then :
elif ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  echo "compare-ucx: no mpicc/mpirun, Open MPI left out (scripts/install-deps.sh installs it)" >&2
elif mpicc -O2 -o "$scratch/mpi_p2p" "$src/bench/mpi_p2p.c" 2> "$scratch/mpicc"; then
  mpi_bin="$scratch/mpi_p2p"
else
  echo "compare-ucx: bench/mpi_p2p.c did not build, Open MPI left out:" >&2; cat "$scratch/mpicc" >&2
fi

bytes_of() { numfmt --from=iec "$1"; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

# messages SIZE -> how many both sides run at that size
messages() { if [ "$(bytes_of "$1")" -ge 1048576 ]; then echo "$iters_large"; else echo "$iters"; fi; }

# hmc SIZE TLS [hmc-probe flags] -> "GBps lat_us eager_limit" of the 0->1 pair
hmc() {
  UCX_TLS=$2 HMC_PROVIDERS=cpu,ucx HMC_PATH=ucx timeout "$run_timeout" \
    "$probe" --local 2 --timeout "$run_timeout" -b "$1" -n "$(messages "$1")" --lat-iters "$lat_iters" \
    --lat-warmup "$warmup" "${@:3}" \
    > "$scratch/hmc" 2>&1 || {
    echo "compare-ucx: hmc-probe failed:" >&2; cat "$scratch/hmc" >&2; return 1; }
  awk '$1 == "0" && $2 == "1" && $5 == "ucx" { print $6, $7, $9; found = 1 } END { exit !found }' "$scratch/hmc" || {
    echo "compare-ucx: no ucx pair in hmc-probe's output:" >&2; cat "$scratch/hmc" >&2; return 1; }
}

# perftest TLS TEST SIZE ITERS [ucx_perftest flags] -> the "Final:" line's fields. The port is random; one
# still held by an earlier run (the server's bind fails) gets up to two more tries.
perftest() {
  local try port server_flags=""
  [[ " ${*:5} " == *" -e "* ]] && server_flags=-e  # both sides must ask for error handling
  for try in 1 2 3; do
    port=$(( 20000 + RANDOM % 20000 ))
    UCX_TLS=$1 timeout "$run_timeout" ucx_perftest -p "$port" $server_flags > "$scratch/srv" 2>&1 &
    server=$!
    sleep 0.5
    UCX_TLS=$1 timeout "$run_timeout" ucx_perftest 127.0.0.1 -p "$port" -t "$2" -s "$3" -n "$4" "${@:5}" > "$scratch/cli" 2>&1 || true
    wait "$server" 2>/dev/null || true
    server=""
    grep -q 'bind() failed' "$scratch/srv" || break
  done
  awk '/^Final:/ { print; found = 1 } END { exit !found }' "$scratch/cli" || {
    echo "compare-ucx: ucx_perftest $2 failed:" >&2; cat "$scratch/cli" "$scratch/srv" >&2; return 1; }
}

# ompi TLS mpi_p2p-arguments -> its one number; the libucp it mapped goes to $scratch/ompi_ucx.
# Open MPI 4.1's UCX layer declines a host without a network device unless told to take any
# (pml_ucx_tls, pml_ucx_devices).
ompi() {
  timeout "$run_timeout" mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 --mca pml ucx \
    --mca pml_ucx_tls any --mca pml_ucx_devices any -x UCX_TLS="$1" "$mpi_bin" "${@:2}" > "$scratch/ompi" 2>&1 &&
    awk '$1 + 0 > 0 && NF >= 2 { print $1; sub(/^[^ ]+ /, ""); print > lib; found = 1 } END { exit !found }' \
      lib="$scratch/ompi_ucx" "$scratch/ompi" || {
    echo "compare-ucx: Open MPI's mpi_p2p ${*:2} failed:" >&2; cat "$scratch/ompi" >&2; return 1; }
}

ucx_version=$( (ucx_info -v 2>/dev/null || true) | head -1 | sed 's/^# //')
echo "compare-ucx: ${ucx_version:-UCX (no ucx_info to say which)}, $(nproc) cores, $(uname -r); median of $repeat runs"
printf "%-5s %6s %5s | %9s %9s %9s %9s | %9s %9s %9s %9s %9s | %9s %9s %9s %9s | %9s %9s | %7s %7s %6s %7s %6s %7s %8s %6s\n" \
  UCX_TLS size eager "HMC s/r" "s/r rot" "HMC put" "put+ntf" "put_bw" "s/r:put" "rot:put" "put:put" "p+n:put" "tag_bw" \
  "s/r:tag" "tag_bw-e" "s/r:tge" "OMPI s/r" "o:put" "HMC lat" tag_lat ratio polled ratio am_lat "OMPI lat" ratio
ratio() { awk -v h="$1" -v u="$2" 'BEGIN { printf "%8.0f%%", 100 * h / u }'; }
# round_ratio A B -> the median over the rounds of A's figure over B's (files in $scratch)
round_ratio() { paste -d' ' "$scratch/$1" "$scratch/$2" | awk '{ print $1 / $2 }' | median; }
# each A -> the rounds' figures of A on one line, about three significant digits, no exponents
each() { awk '{ printf "%s" ($1 >= 100 ? "%.0f" : $1 >= 0.01 ? "%.3g" : "%.5f"), (NR > 1 ? " " : ""), $1 }' "$scratch/$1"; }
# round_pct A B -> round_ratio as a percentage; the medians' ratio where B lacks rounds (a
# tag_bw -e that UCX refused after the first round)
round_pct() {
  if [ "$(wc -l < "$scratch/$1")" = "$(wc -l < "$scratch/$2")" ]; then ratio "$(round_ratio "$1" "$2")" 1
  else ratio "$(median < "$scratch/$1")" "$(median < "$scratch/$2")"; fi
}
rounds=""
for tls in $tls_list; do
  with_e=1  # tag_bw -e until UCX refuses it for this UCX_TLS (over shm: no transport handles peer failure)
  for size in $sizes; do
    b=$(bytes_of "$size")
    n=$(messages "$size")
    for f in hb hr hp hn hl hq ub ul tb te al ob ol; do : > "$scratch/$f"; done
    eager=""
    for ((i = 0; i < repeat; i++)); do
      read -r gbps _ eager < <(hmc "$size" "$tls")
      echo "$gbps" >> "$scratch/hb"
      read -r gbps _ _ < <(hmc "$size" "$tls" --rotate)
      echo "$gbps" >> "$scratch/hr"
      read -r gbps _ _ < <(hmc "$size" "$tls" --put)
      echo "$gbps" >> "$scratch/hp"
      read -r gbps _ _ < <(hmc "$size" "$tls" --put --notify)
      echo "$gbps" >> "$scratch/hn"
      # Final: iters p50 avg overall bw_avg bw_overall rate_avg rate_overall (MB/s = MiB/s)
      perftest "$tls" ucp_put_bw "$b" "$n" | awk '{ print $7 * 1048576 / 1e9 }' >> "$scratch/ub"
      perftest "$tls" tag_bw "$b" "$n" | awk '{ print $7 * 1048576 / 1e9 }' >> "$scratch/tb"
      if [ $with_e = 1 ] && perftest "$tls" tag_bw "$b" "$n" -e > "$scratch/te_run" 2> "$scratch/te_err"; then
        awk '{ print $7 * 1048576 / 1e9 }' "$scratch/te_run" >> "$scratch/te"
      elif [ $with_e = 1 ]; then
        with_e=0
        echo "compare-ucx: no tag_bw -e over UCX_TLS=$tls ('-'): $(grep -m1 -o 'ERROR.*' "$scratch/te_err" || echo 'ucx_perftest failed')" >&2
      fi
      [ -z "$mpi_bin" ] || ompi "$tls" bw "$size" "$n" >> "$scratch/ob"
      if [ "$size" = "${sizes%% *}" ]; then
        # The latencies back to back, so that each round's ratios compare like with like.
        read -r _ lat _ < <(hmc "$size" "$tls")
        echo "$lat" >> "$scratch/hl"
        read -r _ lat _ < <(hmc "$size" "$tls" --lat-poll)
        echo "$lat" >> "$scratch/hq"
        perftest "$tls" tag_lat 8 "$lat_iters" -w "$warmup" | awk '{ print $4 }' >> "$scratch/ul"
        perftest "$tls" ucp_am_lat 8 "$lat_iters" -w "$warmup" | awk '{ print $4 }' >> "$scratch/al"
        [ -z "$mpi_bin" ] || ompi "$tls" lat "$lat_iters" "$warmup" >> "$scratch/ol"
      fi
    done
    hb=$(median < "$scratch/hb"); hr=$(median < "$scratch/hr"); hp=$(median < "$scratch/hp"); hn=$(median < "$scratch/hn"); ub=$(median < "$scratch/ub"); tb=$(median < "$scratch/tb")
    if [ -s "$scratch/te" ]; then
      te=$(median < "$scratch/te")
      tge_cols="$(printf "%9.3f" "$te") $(round_pct hb te)"
    else
      tge_cols=$(printf "%9s %9s" - -)
    fi
    if [ -s "$scratch/ob" ]; then
      ob=$(median < "$scratch/ob")
      ompi_cols="$(printf "%9.3f" "$ob") $(round_pct ob ub)"
    else
      ompi_cols=$(printf "%9s %9s" - -)
    fi
    if [ -s "$scratch/ul" ]; then
      hl=$(median < "$scratch/hl"); hq=$(median < "$scratch/hq"); ul=$(median < "$scratch/ul"); al=$(median < "$scratch/al")
      lat_cols=$(awk -v h="$hl" -v q="$hq" -v u="$ul" -v a="$al" -v rh="$(round_ratio hl ul)" -v rq="$(round_ratio hq ul)" \
        'BEGIN { printf "%7.2f %7.2f %5.1fx %6.2f %6.1fx %7.2f", h, u, rh, q, rq, a }')
      if [ -s "$scratch/ol" ]; then
        lat_cols+=$(awk -v o="$(median < "$scratch/ol")" -v r="$(round_ratio ol ul)" 'BEGIN { printf " %8.2f %5.1fx", o, r }')
      else
        lat_cols+=$(printf " %8s %6s" - -)
      fi
      rounds+="8 B over $tls, each round (us): HMC waited $(paste -sd' ' "$scratch/hl"); polled $(paste -sd' ' "$scratch/hq");"
      rounds+=" tag_lat $(paste -sd' ' "$scratch/ul"); OMPI $( [ -s "$scratch/ol" ] && paste -sd' ' "$scratch/ol" || echo -)"$'\n'
    else
      lat_cols=$(printf "%7s %7s %6s %6s %7s %7s %8s %6s" "" "" "" "" "" "" "" "")
    fi
    printf "%-5s %6s %5s | %9.3f %9.3f %9.3f %9.3f | %9.3f %s %s %s %s | %9.3f %s %s | %s | %s\n" "$tls" "$size" \
      "$eager" "$hb" "$hr" "$hp" "$hn" "$ub" "$(round_pct hb ub)" "$(round_pct hr ub)" "$(round_pct hp ub)" \
      "$(round_pct hn ub)" "$tb" "$(round_pct hb tb)" "$tge_cols" "$ompi_cols" "$lat_cols"
    # (below 1 KiB hmc-probe's two decimals of GB/s say little: no line)
    [ "$b" -lt 1024 ] ||
      rounds+="$size over $tls, each round (GB/s): HMC s/r $(each hb); put $(each hp); put_bw $(each ub); tag_bw $(each tb)"$'\n'
  done
done
echo "HMC s/r: hmc-probe --local 2 -b SIZE over ucx, send/recv (eager up to the pair's eager limit, then rendezvous: by get, put or split, per the pair's bands in hmc-probe's matrix);"
echo "s/r rot: the same with --rotate (the messages in flight into 4 buffers in turn; rot:put = s/r rot / put_bw);"
echo "HMC put: the same with --put (Communicator::put stream); put+ntf: --put --notify (each put notifies, the target waits"
echo "for every notification); ratios: s/r:put = HMC s/r / put_bw, put:put = HMC put / put_bw, p+n:put = put+ntf / put_bw,"
echo "s/r:tag = HMC s/r / tag_bw, s/r:tge = HMC s/r / tag_bw-e, each the median of the rounds' ratios (a round's figures"
echo "follow the table). UCX: ucx_perftest -t ucp_put_bw / tag_bw -s SIZE, tag_bw-e:"
echo "tag_bw with -e (peer failure handling, as HMC's endpoints; '-' where no transport has it, as over shm);"
echo "latency (8 B, first size): tag_lat, ucp_am_lat."
echo "HMC lat: hmc-probe's half round trip with Request::wait (yields between polls); polled: with --lat-poll (Request::test"
echo "back to back, as ucx_perftest polls); ratios against tag_lat: the median of each round's ratio, the latencies of a round"
echo "measured back to back (on a VM the time between the two ranks' CPUs can change from one minute to the next:"
echo "tag_lat 0.1 or 0.5 us on one 2-vCPU VM)."
echo "OMPI s/r, OMPI lat: Open MPI over the same UCX (pml ucx), bench/mpi_p2p.c (malloc'd buffers); o:put = OMPI s/r / put_bw."
printf "%s" "$rounds"
if [ -n "$mpi_bin" ]; then
  echo "Open MPI: $( (mpirun --version 2>/dev/null || true) | head -n 1), its UCX: $(cat "$scratch/ompi_ucx" 2>/dev/null || echo -);" \
    "HMC's UCX: $(readlink -f "$(ldd "$build/lib/libhmc-net-ucx.so" | awk '$1 ~ /^libucp/ { print $3 }')")"
fi
