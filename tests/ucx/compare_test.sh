#!/usr/bin/env bash
# bench/compare-ucx.sh end to end, with counts small enough for a test: it must finish,
# and every column it fills must hold a figure above zero. Speed is not checked (that is
# the script's own business, docs/performance.md); what is checked is that HMC, ucx_perftest
# (tag_bw -e too over tcp; "-" over shm, where no UCX 1.13 transport handles peer failure)
# and, where mpicc/mpirun are installed, Open MPI (bench/mpi_p2p.c, which checks one
# message's bytes itself) all ran and were read, and that each transport's line of the
# rounds' 8 B latencies and 64 KiB figures follows the table.
set -u
build=${1:?usage: compare_test.sh path/to/build}
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/hmc-compare-test.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
if ! command -v ucx_perftest > /dev/null; then
  echo "skipped: no ucx_perftest (ucx-utils)"; exit 77
fi
REPEAT=1 ITERS=400 ITERS_LARGE=40 LAT_ITERS=400 WARMUP=40 RUN_TIMEOUT=60 \
  timeout 400 "$src/bench/compare-ucx.sh" --build "$build" --tls "shm tcp" --sizes "8 64K" > "$scratch/out" 2>&1
rc=$?
cat "$scratch/out"
[ $rc = 0 ] || { echo "FAILED: compare-ucx.sh exited $rc"; exit 1; }
ompi=1
command -v mpicc > /dev/null && command -v mpirun > /dev/null && [ "${OMPI:-1}" != 0 ] || ompi=0
# The rows: UCX_TLS size eager | HMC ... | put_bw ... | tag_bw s/r:tag tag_bw-e s/r:tge |
# OMPI s/r o:put | latencies
awk -F'|' -v ompi=$ompi '
  function pos(x) { return x ~ /^[0-9.]+$/ && x + 0 > 0 }
  { split($1, k, " ") }
  k[2] == "64K" {
    split($2, h, " "); split($3, u, " "); split($4, t, " "); split($5, o, " ")
    ++rows
    if (!pos(h[1]) || !pos(h[3]) || !pos(u[1]) || !pos(t[1])) { print "FAILED: a " k[1] " 64K figure of HMC or UCX is missing"; bad = 1 }
    if (k[1] == "tcp" ? !pos(t[3]) : t[3] != "-") { print "FAILED: " k[1] "'"'"'s tag_bw-e reads \"" t[3] "\""; bad = 1 }
    if (ompi ? !pos(o[1]) : o[1] != "-") { print "FAILED: the " k[1] " 64K Open MPI column reads \"" o[1] "\""; bad = 1 }
  }
  # Each round'\''s latencies, printed after the table: HMC'\''s and tag_lat'\''s read for each transport.
  /^8 B over (shm|tcp), each round \(us\): HMC waited [0-9.]+; polled [0-9.]+; tag_lat [0-9.]+; OMPI / { ++round_lines }
  # and each round'\''s 64 KiB figures, which the table'\''s ratios come from.
  /^64K over (shm|tcp), each round \(GB\/s\): HMC s\/r [0-9.]+; put [0-9.]+; put_bw [0-9.]+; tag_bw [0-9.]+$/ { ++bw_lines }
  k[2] == "8" {
    split($6, l, " ")
    ++lats
    if (!pos(l[1]) || !pos(l[2]) || !pos(l[4])) { print "FAILED: a " k[1] " 8 B latency of HMC or UCX is missing"; bad = 1 }
    if (ompi ? !pos(l[7]) : l[7] != "-") { print "FAILED: the " k[1] " Open MPI latency reads \"" l[7] "\""; bad = 1 }
  }
  END {
    if (rows != 2 || lats != 2) { print "FAILED: not one 64K and one 8 row for each of shm and tcp"; bad = 1 }
    if (round_lines != 2) { print "FAILED: not one line of each round'\''s latencies for each of shm and tcp"; bad = 1 }
    if (bw_lines != 2) { print "FAILED: not one line of each round'\''s 64K figures for each of shm and tcp"; bad = 1 }
    if (!bad) print "ok: every column filled" (ompi ? ", Open MPI included" : " (no Open MPI here)")
    exit bad
  }' "$scratch/out"
