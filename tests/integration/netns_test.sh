#!/usr/bin/env bash
# Two "hosts" in network namespaces joined by a veth pair (10.77.x.0/24): a rank in each.
#   netns_test.sh BIN        tcp carries the pair
#   netns_test.sh BIN ucx    ucx over tcp carries it (HMC_PATH=ucx, UCX_TLS=tcp); ucx with
#                            shared memory only (UCX_TLS=shm) is not picked for it, and forcing
#                            it fails at once on both ranks with the reason
# BIN is hmc-p2p-check. Needs root and iproute2; exits 77 (skipped) without them. Cleans up
# whatever happens.
set -u
bin=${1:?usage: netns_test.sh path/to/hmc-p2p-check [ucx]}
mode=${2:-tcp}
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "skipped: needs root and iproute2 (ip netns)"; exit 77
fi
tag=$$
a=hmcA$tag b=hmcB$tag
net=$(( (tag % 200) + 20 ))
out0=$(mktemp) out1=$(mktemp)
cleanup() {
  ip netns pids "$a" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns pids "$b" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  rm -f "$out0" "$out1"
  true
}
trap cleanup EXIT
if ! ip netns add "$a" 2>/dev/null || ! ip netns add "$b"; then
  echo "skipped: cannot create network namespaces here"; exit 77
fi
ip link add "va$tag" type veth peer name "vb$tag" || exit 1
ip link set "va$tag" netns "$a" && ip link set "vb$tag" netns "$b" || exit 1
ip -n "$a" addr add "10.77.$net.1/24" dev "va$tag" && ip -n "$b" addr add "10.77.$net.2/24" dev "vb$tag" || exit 1
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "va$tag" up && ip -n "$b" link set "vb$tag" up || exit 1

secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
runs=0
# pair ENV... : one rank in each namespace with ENV; sets r0 r1 and out (both ranks' output)
pair() {
  runs=$((runs + 1))
  local port=$(( 20000 + (tag + runs * 97) % 20000 ))
  local common="HMC_WORLD_SIZE=2 HMC_ROOT=10.77.$net.1:$port HMC_SECRET=$secret HMC_TIMEOUT=30s"
  ip netns exec "$a" env $common HMC_RANK=0 HMC_HOST_ID=hostA "$@" timeout 90 "$bin" > "$out0" 2>&1 &
  local p0=$!
  ip netns exec "$b" env $common HMC_RANK=1 HMC_HOST_ID=hostB "$@" timeout 90 "$bin" > "$out1" 2>&1 &
  local p1=$!
  wait $p0; r0=$?
  wait $p1; r1=$?
  out=$(cat "$out0" "$out1")
  echo "--- $*"
  echo "$out"
}
# carried_by PROVIDER : both ranks ended well and each used PROVIDER for the other
carried_by() {
  if [ $r0 -ne 0 ] || [ $r1 -ne 0 ]; then echo "FAILED: rank exits $r0 $r1"; exit 1; fi
  for r in "0 -> rank 1" "1 -> rank 0"; do
    grep -q "rank $r on .*: $1 " <<<"$out" || { echo "FAILED: rank $r did not use $1"; exit 1; }
  done
  [ "$(grep -c "all data checked" <<<"$out")" = 2 ] || { echo "FAILED: data not checked on both ranks"; exit 1; }
}

case "$mode" in
  tcp)
    pair HMC_PROVIDERS=cpu,tcp
    carried_by tcp
    echo "ok: two namespaces exchanged data over tcp" ;;
  ucx)
    pair HMC_PROVIDERS=cpu,ucx HMC_PATH=ucx UCX_TLS=tcp
    carried_by ucx
    # Shared memory reaches no other host: the cheaper-looking ucx must lose to tcp.
    pair HMC_PROVIDERS=cpu,tcp,ucx UCX_TLS=shm
    carried_by tcp
    start=$(date +%s)
    pair HMC_PROVIDERS=cpu,ucx HMC_PATH=ucx UCX_TLS=shm
    if [ $r0 -eq 0 ] || [ $r1 -eq 0 ]; then echo "FAILED: forcing ucx over shared memory across hosts did not fail"; exit 1; fi
    [ "$(grep -c "HMC_PATH forces ucx to rank .* same-host only, peer on host .*(host id host[AB])" <<<"$out")" -ge 1 ] ||
      { echo "FAILED: no reason naming same-host only"; exit 1; }
    [ $(( $(date +%s) - start )) -lt 20 ] || { echo "FAILED: took $(( $(date +%s) - start )) s to fail"; exit 1; }
    echo "ok: ucx carried two namespaces over tcp, and was not picked (or refused when forced) over shm" ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
