#!/usr/bin/env bash
# Two "hosts" in network namespaces joined by a veth pair (10.77.x.0/24): a rank in each,
# talking over tcp. Needs root and iproute2; exits 77 (skipped) without them. Cleans up
# whatever happens.
set -u
bin=${1:?usage: netns_test.sh path/to/hmc-p2p-check}
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "skipped: needs root and iproute2 (ip netns)"; exit 77
fi
tag=$$
a=hmcA$tag b=hmcB$tag
net=$(( (tag % 200) + 20 ))
cleanup() {
  ip netns pids "$a" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns pids "$b" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
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

port=$(( 20000 + tag % 20000 ))
secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
common="HMC_WORLD_SIZE=2 HMC_ROOT=10.77.$net.1:$port HMC_SECRET=$secret HMC_PROVIDERS=cpu,tcp HMC_TIMEOUT=30s"
ip netns exec "$a" env $common HMC_RANK=0 HMC_HOST_ID=hostA timeout 90 "$bin" > "/tmp/hmc-netns-$tag.0" 2>&1 &
p0=$!
ip netns exec "$b" env $common HMC_RANK=1 HMC_HOST_ID=hostB timeout 90 "$bin" > "/tmp/hmc-netns-$tag.1" 2>&1 &
p1=$!
wait $p0; r0=$?
wait $p1; r1=$?
out=$(cat "/tmp/hmc-netns-$tag.0" "/tmp/hmc-netns-$tag.1")
echo "$out"
rm -f "/tmp/hmc-netns-$tag.0" "/tmp/hmc-netns-$tag.1"
if [ $r0 -ne 0 ] || [ $r1 -ne 0 ]; then echo "FAILED: rank exits $r0 $r1"; exit 1; fi
if ! grep -q "rank 0 -> rank 1 on .*: tcp" <<<"$out"; then echo "FAILED: rank 0 did not use tcp"; exit 1; fi
echo "ok: two namespaces exchanged data over tcp"
