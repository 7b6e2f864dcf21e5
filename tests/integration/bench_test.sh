#!/usr/bin/env bash
# hmc-bench end to end: every collective on 3 local ranks, its results checked (-c 1: the
# tool exits non-zero on any wrong element), with the timed calls waited one by one (-z 1)
# and issued back to back (-z 0), over the shared segments and over messages
# (HMC_SHM_COLL=0). Every run has a deadline.
set -u
bench=${1:?usage: bench_test.sh path/to/hmc-bench}
fail=0
out=$(mktemp "${TMPDIR:-/tmp}/hmc-bench-test.XXXXXX")
trap 'rm -f "$out"' EXIT
for segments in 1 0; do
  for z in 1 0; do
    for c in all_reduce all_gather reduce_scatter broadcast reduce all_to_all gather scatter sendrecv barrier; do
      if HMC_SHM_COLL=$segments timeout 120 "$bench" "$c" --local 3 -b 8 -e 256K -f 64 -n 20 -w 2 -c 1 -z "$z" \
           --timeout 100 > "$out" 2>&1 && grep -q 'Out of bounds values : 0 OK' "$out"; then
        echo "ok: $c -z $z HMC_SHM_COLL=$segments"
      else
        echo "FAILED: $c -z $z HMC_SHM_COLL=$segments"; cat "$out"; fail=1
      fi
    done
  done
done
exit $fail
