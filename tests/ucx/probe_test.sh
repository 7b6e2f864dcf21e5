#!/usr/bin/env bash
# hmc-probe and the ucx provider, in three set-ups; every run has a deadline.
#   1. UCX_TLS=nonsense: ucx is listed unavailable with UCX's reason, and two
#      local ranks still exchange data over shm.
#   2. The plugin missing: libhmc copied into an empty folder with tcp and shm
#      only (LD_LIBRARY_PATH wins over the build's RUNPATH, and the loader looks
#      next to libhmc): ucx is not listed, two local ranks still work.
#   3. UCX_TLS=shm: the path matrix names shm and says ucx came second, with costs.
#   4. HMC_HOST_ID=h{rank}: each local rank gets its own host id, so shm is ruled out
#      and the pair goes over a network provider.
#   5. --put over ucx with UCX_TLS=shm: the matrix measures puts, names ucx and the
#      pair's eager limit (32K, ucx's advice over shared memory), with a bandwidth, its
#      get bands and split rendezvous from 128K; --put with device buffers is refused.
#   6. --memory malloc: heap buffers still give a shm row with a bandwidth; an unknown
#      kind is refused.
#   7. --lat-poll over ucx: the matrix says its latency was polled, and gives one,
#      and what an empty poll cost (poll ns, above zero).
#   8. --put --notify over ucx and over shm: the matrix measures notified puts (the
#      target checks that every notification came, in order; hmc-probe fails if not);
#      --notify without --put is refused.
#   9. --lat-warmup: the matrix says how many round trips were timed and how many
#      untimed before them, with a latency over ucx; a negative count is refused.
#  10. --rotate: the matrix says the messages in flight went into 4 buffers in turn, with a
#      bandwidth over ucx (which copies in turns there from 64K: "64K+") and over tcp ("-"); notified
#      puts into 4 places in turn still arrive in order.
set -u
probe=${1:?usage: probe_test.sh path/to/hmc-probe path/to/lib}
lib=${2:?usage: probe_test.sh path/to/hmc-probe path/to/lib}
fail=0
scratch=$(mktemp -d "${TMPDIR:-/tmp}/hmc-probe-test.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
# A bandwidth above zero as hmc-probe prints it (0.13 counts: a loaded 2-core CI machine).
positive='([0-9]*[1-9][0-9]*\.[0-9]+|[0-9]+\.[0-9]*[1-9][0-9]*)'
check() {  # check NAME PATTERN FILE: PATTERN (grep -E) must occur in FILE
  if grep -Eq "$2" "$3"; then echo "ok: $1"; else echo "FAILED: $1 (no '$2')"; cat "$3"; fail=1; fi
}
run() {  # run OUT CMD...: runs under a deadline, output to OUT
  local out=$1; shift
  if ! timeout 120 "$@" > "$out" 2>&1; then echo "FAILED: $* (exit $?)"; cat "$out"; fail=1; fi
}

UCX_TLS=nonsense run "$scratch/bad" "$probe"
check "UCX_TLS=nonsense: ucx unavailable with the reason" 'ucx.*unavailable.*ucp_init' "$scratch/bad"
UCX_TLS=nonsense run "$scratch/bad-local" "$probe" --local 2 --timeout 60 -b 1M -n 3
check "UCX_TLS=nonsense: ranks still connect over shm" '\bshm\b' "$scratch/bad-local"

mkdir -p "$scratch/lib"
cp -P "$lib"/libhmc.so* "$lib"/libhmc-net-tcp.so "$lib"/libhmc-net-shm.so "$scratch/lib/"
LD_LIBRARY_PATH="$scratch/lib" run "$scratch/missing" "$probe"
if grep -E "^ +ucx +net" "$scratch/missing"; then echo "FAILED: ucx listed without its plugin"; fail=1; fi
check "plugin missing: tcp and shm listed" 'shm' "$scratch/missing"
LD_LIBRARY_PATH="$scratch/lib" run "$scratch/missing-local" "$probe" --local 2 --timeout 60 -b 1M -n 3
check "plugin missing: ranks still connect over shm" '\bshm\b' "$scratch/missing-local"

UCX_TLS=shm run "$scratch/shm-local" "$probe" --local 2 --timeout 60 -b 1M -n 3
check "UCX_TLS=shm: shm chosen over ucx, with the costs" ' shm .*lowest modelled cost .* vs ucx [0-9]+ us' "$scratch/shm-local"
HMC_HOST_ID='h{rank}' run "$scratch/hosts" "$probe" --local 2 --timeout 60 -b 1M -n 3
check "HMC_HOST_ID=h{rank}: the ranks look like two hosts" '^ +0 +1 +cpu:0 +cpu:0 +(tcp|ucx) ' "$scratch/hosts"
if grep -Eq '^ +[01] +[01] +cpu:0 +cpu:0 +shm ' "$scratch/hosts"; then echo "FAILED: shm between two host ids"; fail=1; fi
UCX_TLS=shm HMC_PROVIDERS=cpu,ucx HMC_PATH=ucx run "$scratch/put" "$probe" --local 2 --timeout 60 -b 1M -n 20 --put
check "--put: the matrix measures puts" 'bandwidth one way with 1 MiB puts' "$scratch/put"
check "--put: 0->1 over ucx, eager limit 32K, a bandwidth" '^ +0 +1 +cpu:0 +cpu:0 +ucx +'"$positive"' +[0-9.]+ +[0-9]+ +32K ' "$scratch/put"
check "--put: gets up to 512K and from 1536K, split from 128K" ' ucx .* 32K +512K,1536K\+ +128K\+ ' "$scratch/put"
if timeout 60 "$probe" --local 2 --put -g cuda > "$scratch/put-dev" 2>&1; then
  echo "FAILED: --put with device buffers was accepted"; cat "$scratch/put-dev"; fail=1
fi
check "--put with device buffers: refused with the reason" 'host buffers only' "$scratch/put-dev"
run "$scratch/heap" "$probe" --local 2 --timeout 60 -b 256K -n 20 --memory malloc
check "--memory malloc: a shm row with a bandwidth" '^ +0 +1 +cpu:0 +cpu:0 +shm +'"$positive"' ' "$scratch/heap"
if timeout 60 "$probe" --local 2 --memory nope > "$scratch/heap-bad" 2>&1; then
  echo "FAILED: --memory nope was accepted"; cat "$scratch/heap-bad"; fail=1
fi
UCX_TLS=shm HMC_PROVIDERS=cpu,ucx HMC_PATH=ucx run "$scratch/poll" "$probe" --local 2 --timeout 60 -b 64K -n 20 --lat-poll
check "--lat-poll: the matrix says the latency was polled" 'half a round trip of 8 B, polled, 2000 of them, after 10 untimed' "$scratch/poll"
check "--lat-poll: 0->1 over ucx with a latency and an empty poll's cost" \
  '^ +0 +1 +cpu:0 +cpu:0 +ucx +[0-9.]+ +'"$positive"' +[1-9][0-9]* +32K ' "$scratch/poll"
UCX_TLS=shm HMC_PROVIDERS=cpu,ucx HMC_PATH=ucx run "$scratch/warm" "$probe" --local 2 --timeout 60 -b 8 -n 20 \
  --lat-iters 300 --lat-warmup 3000
check "--lat-warmup: the matrix says how many round trips were untimed" '8 B, 300 of them, after 3000 untimed' "$scratch/warm"
check "--lat-warmup: 0->1 over ucx with a latency" '^ +0 +1 +cpu:0 +cpu:0 +ucx +[0-9.]+ +'"$positive"' ' "$scratch/warm"
if timeout 60 "$probe" --local 2 --lat-warmup -5 > "$scratch/warm-bad" 2>&1; then
  echo "FAILED: --lat-warmup -5 was accepted"; cat "$scratch/warm-bad"; fail=1
fi
check "--lat-warmup -5: refused with the reason" 'lat-warmup: Value -5 not in range' "$scratch/warm-bad"
for net in ucx shm; do
  UCX_TLS=shm HMC_PATH=$net run "$scratch/notify-$net" "$probe" --local 2 --timeout 60 -b 64K -n 200 --put --notify
  check "--put --notify over $net: the matrix measures notified puts" 'with 64 KiB notified puts' "$scratch/notify-$net"
  check "--put --notify over $net: 0->1 with a bandwidth" '^ +0 +1 +cpu:0 +cpu:0 +'$net' +'"$positive"' ' "$scratch/notify-$net"
done
if timeout 60 "$probe" --local 2 --notify > "$scratch/notify-alone" 2>&1; then
  echo "FAILED: --notify without --put was accepted"; cat "$scratch/notify-alone"; fail=1
fi
check "--notify without --put: refused with the reason" 'goes with --put' "$scratch/notify-alone"
for tls in shm tcp; do
  turns=$([ $tls = shm ] && echo '64K\+' || echo -)
  UCX_TLS=$tls HMC_PROVIDERS=cpu,ucx HMC_PATH=ucx run "$scratch/rotate-$tls" "$probe" --local 2 --timeout 60 -b 64K -n 200 --rotate
  check "--rotate, UCX_TLS=$tls: the matrix says the buffers rotate" 'with 64 KiB messages into 4 buffers in turn' "$scratch/rotate-$tls"
  check "--rotate, UCX_TLS=$tls: 0->1 over ucx with a bandwidth, turns $turns" \
    '^ +0 +1 +cpu:0 +cpu:0 +ucx +'"$positive"' .* '"$turns"' +forced by HMC_PATH' "$scratch/rotate-$tls"
done
UCX_TLS=shm HMC_PROVIDERS=cpu,ucx HMC_PATH=ucx run "$scratch/rotate-put" "$probe" --local 2 --timeout 60 -b 64K -n 200 --put --notify --rotate
check "--put --notify --rotate: notified puts into 4 places in turn" 'with 64 KiB notified puts into 4 buffers in turn' "$scratch/rotate-put"
check "--put --notify --rotate: 0->1 with a bandwidth" '^ +0 +1 +cpu:0 +cpu:0 +ucx +'"$positive"' ' "$scratch/rotate-put"
exit $fail
