#!/usr/bin/env bash
# hmc-bench end to end: every collective on 3 local ranks, its results checked (-c 1: the
# tool exits non-zero on any wrong element), with the timed calls waited one by one (-z 1)
# and issued back to back (-z 0), over the shared segments and over messages
# (HMC_SHM_COLL=0). Every run has a deadline.
#
#   bench_test.sh path/to/hmc-bench [hmc-bench flags...]
#
# Flags after the binary go to every run (ctest's bench.stream: -g emu --stream, device
# buffers and stream-ordered calls); SEGMENTS="1 0" lists the HMC_SHM_COLL values to run,
# COLLS the collectives (default: all ten).
set -u
bench=${1:?usage: bench_test.sh path/to/hmc-bench [hmc-bench flags...]}
shift
fail=0
out=$(mktemp "${TMPDIR:-/tmp}/hmc-bench-test.XXXXXX")
trap 'rm -f "$out"' EXIT
# A device this machine does not have (-g cuda without a GPU) skips the test (exit 77).
if ! timeout 60 "$bench" all_reduce -b 8 -e 8 -n 1 -w 0 "$@" > "$out" 2>&1 &&
   grep -q "no device of provider" "$out"; then
  echo "skipped: $(grep -m1 "no device of provider" "$out")"
  exit 77
fi
for segments in ${SEGMENTS:-1 0}; do
  for z in 1 0; do
    for c in ${COLLS:-all_reduce all_gather reduce_scatter broadcast reduce all_to_all gather scatter sendrecv barrier}; do
      if HMC_SHM_COLL=$segments timeout 120 "$bench" "$c" --local 3 -b 8 -e 256K -f 64 -n 20 -w 2 -c 1 -z "$z" \
           --timeout 100 "$@" > "$out" 2>&1 && grep -q 'Out of bounds values : 0 OK' "$out"; then
        echo "ok: $c -z $z HMC_SHM_COLL=$segments $*"
      else
        echo "FAILED: $c -z $z HMC_SHM_COLL=$segments $*"; cat "$out"; fail=1
      fi
    done
  done
done
exit $fail
