#!/usr/bin/env bash
# Communicator::from_env under the variables launchers set: torchrun's RANK/WORLD_SIZE/
# MASTER_ADDR/MASTER_PORT (+TORCHELASTIC_RUN_ID as the secret's seed) and Open MPI's
# OMPI_COMM_WORLD_RANK/SIZE with HMC_ROOT. Every rank checks the data it received.
set -u
bin=${1:?usage: launcher_env_test.sh path/to/hmc-p2p-check}
fail=0
run_job() {  # run_job NAME N ENV...: N ranks, RANKVAR substituted per rank
  local name=$1 n=$2; shift 2
  local pids=() r
  for ((r = 0; r < n; r++)); do
    env "${@//@RANK@/$r}" HMC_TIMEOUT=30s timeout 60 "$bin" > "/tmp/hmc-launch-$$-$name-$r" 2>&1 &
    pids+=($!)
  done
  for ((r = 0; r < n; r++)); do
    if ! wait "${pids[$r]}"; then
      echo "FAILED: $name rank $r"; cat "/tmp/hmc-launch-$$-$name-$r"; fail=1
    fi
    rm -f "/tmp/hmc-launch-$$-$name-$r"
  done
}
# Below the kernel's ephemeral range: a port in it can be held by any outgoing connection
# on this machine, and the root's listen then fails with "Address already in use".
low=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "$low" -gt 11000 ] 2>/dev/null || low=32768
port=$(( 10000 + $$ % (low - 10010) ))
run_job torchrun 3 RANK=@RANK@ WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TORCHELASTIC_RUN_ID=job-$$
run_job mpirun 2 OMPI_COMM_WORLD_RANK=@RANK@ OMPI_COMM_WORLD_SIZE=2 HMC_ROOT=127.0.0.1:$((port + 7)) \
  HMC_SECRET=00112233445566778899aabbccddeeff
# Two communicators one after the other from the same variables in each process: the second
# root takes the port once the first job is over.
run_job again 3 P2P_CHECK_ROUNDS=2 HMC_RANK=@RANK@ HMC_WORLD_SIZE=3 HMC_ROOT=127.0.0.1:$((port + 5)) \
  HMC_SECRET=00112233445566778899aabbccddeeff
# An IPv6 root, bracketed as HMC_ROOT takes it, ranks on two "hosts" (tcp between them).
if grep -q '^00000000000000000000000000000001 ' /proc/net/if_inet6 2>/dev/null; then
  run_job ipv6 2 OMPI_COMM_WORLD_RANK=@RANK@ OMPI_COMM_WORLD_SIZE=2 "HMC_ROOT=[::1]:$((port + 9))" \
    HMC_HOST_ID=host@RANK@ HMC_SECRET=00112233445566778899aabbccddeeff
else
  echo "no IPv6 loopback here: the IPv6 root is not checked"
fi
[ $fail = 0 ] && echo "ok: torchrun and Open MPI variables, two communicators in a row, an IPv6 root"
exit $fail
