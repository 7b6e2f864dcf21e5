#!/usr/bin/env bash
# The GPU check, in one run on a machine with two GPUs (issue 5): topology, the GPU-labelled
# tests, hmc-bench -c correctness of every collective but the barrier (no data) on 2 GPU
# ranks and on 2 GPU + 2 CPU ranks (small and large sizes), then bench/compare-gpu.sh (HMC
# against NCCL and the CUDA copies). Everything it prints and measures lands in OUTDIR; a
# failed step does not stop the others; the exit status is non-zero when any step failed,
# and the end lists them.
#
#   scripts/gpu-check.sh OUTDIR
#
# Binaries: the carry folder from scripts/pack-gpu-carry.sh (CARRY, default
# <repo>/.carry-gpu) when it is there, else a build (BUILD_DIR, default <repo>/build-gpu)
# made here with cmake and ninja. Every step has a timeout; the whole run stays within
# BUDGET seconds (default 480): steps that would start later are listed as not run.
# TESTS=0 skips the GPU-labelled tests (step 3), CHECKS=0 the hmc-bench -c 1 correctness
# sweeps (step 4), COMPARE=0 the NCCL and CUDA comparison (step 5), STAGED=0 the
# staged-transfer probes (step 6). The device tool brings back a limited number of files:
# tar OUTDIR into its $OUT in the same command.
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)
carry=${CARRY:-$root/.carry-gpu}
budget=${BUDGET:-480}
start=$SECONDS
failed=()
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off
export HMC_LOG_LEVEL=${HMC_LOG_LEVEL:-warn}
exec > >(tee -a "$out/gpu-check.log") 2>&1

# step NAME SECONDS CMD...: output in OUTDIR/NAME.log; a failure (or no time left) is recorded.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 15 ]; then
    echo "-- $name: not run (time budget of $budget s spent)"
    failed+=("$name (not run: time budget)")
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "-- $name ($(date -u +%T), limit $limit s): $*"
  timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "   FAILED (exit $rc$([ $rc -eq 124 ] && echo ': timed out')); last lines of $name.log:"
    tail -15 "$out/$name.log" | sed 's/^/   | /'
    failed+=("$name (exit $rc)")
    return 1
  fi
  grep -h '^# Out of bounds\|^PASS\|^SKIPPED\|^FAIL' "$out/$name.log" | sed 's/^/   /' | head -20
  return 0
}

echo "gpu-check: $(date -u +%FT%TZ) on $(hostname), repo $root, output $out"
git -C "$root" describe --always --dirty 2>/dev/null | sed 's/^/commit: /'

# 1. Binaries.
if [ -x "$carry/bin/hmc-bench" ]; then
  bin=$carry/bin
  export LD_LIBRARY_PATH=$carry/lib:$carry/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  if ! "$bin/hmc-bench" --help >/dev/null 2>"$out/ld-check.log"; then
    echo "gpu-check: this machine's libstdc++ is too old for the carried build ($(head -1 "$out/ld-check.log")); using deps/compat"
    export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$carry/deps/compat
  fi
  echo "gpu-check: carried build $carry ($(head -1 "$carry/MANIFEST" 2>/dev/null))"
  tests=(bash "$carry/gpu-tests.sh" "$out/tests" 170)
else
  build=${BUILD_DIR:-$root/build-gpu}
  echo "gpu-check: no carry folder at $carry; building in $build"
  step build 420 bash -c "cmake -S '$root' -B '$build' -G Ninja && ninja -C '$build'" || true
  bin=$build/bin
  tests=(ctest --test-dir "$build" -L gpu --output-on-failure --timeout 170)
fi
ref_ok=1
[ -x "$bin/hmc-gpu-ref" ] || { echo "gpu-check: no hmc-gpu-ref in $bin"; failed+=("hmc-gpu-ref missing"); ref_ok=0; }

# 2. The machine.
step machine 60 bash -c 'nvidia-smi || exit 1; echo; nvidia-smi topo -m; echo; nvidia-smi -q | grep -i -A2 "fabric\|nvlink" | head -40; echo; uname -a; ldd --version | head -1'
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$gpus" -ge 2 ] || { echo "gpu-check: $gpus GPU(s) visible, 2 needed for GPU<->GPU figures"; failed+=("2 GPUs needed, $gpus seen"); }
sed -n '/GPU0/,/^$/p' "$out/machine.log" | head -12
step probe 60 "$bin/hmc-probe" || true
grep -A4 '^Devices' "$out/probe.log" | sed 's/^/   /'
# Which CUDA calls wait for the whole device (none may run while a stream waits on a flag).
if [ -x "$bin/hmc-cuda-waits" ]; then step cuda-waits 60 "$bin/hmc-cuda-waits"; sed 's/^/   /' "$out/cuda-waits.log"; fi
[ $ref_ok -eq 1 ] && step nccl-smoke 90 "$bin/hmc-gpu-ref" -b 8 -e 1M -f 32 -n 5 -w 2 --no-p2p

# 3. GPU-labelled tests (TESTS=0 leaves them out, for a run that only measures).
if [ "${TESTS:-1}" = 0 ]; then echo "gpu-check: TESTS=0: the GPU-labelled tests are left out"
else step tests 300 "${tests[@]}"; fi

# 4. Correctness: every collective, checked (-c 1), GPU ranks and GPU + CPU ranks
#    (CHECKS=0 leaves it out, for a quicker run after a change that the tests cover).
colls="all_reduce reduce_scatter reduce all_gather broadcast all_to_all gather scatter sendrecv"
[ "${CHECKS:-1}" = 0 ] && echo "gpu-check: CHECKS=0: the hmc-bench -c 1 sweeps are left out"
for cfg in "gpu2:cuda:2" "gpu2cpu2:cuda@0,1:4"; do
  [ "${CHECKS:-1}" = 0 ] && break
  IFS=: read -r tag dev n <<<"$cfg"
  for c in $colls; do
    case $c in all_reduce|reduce_scatter|reduce) types="-d all -o all" ;; *) types="-d all" ;; esac
    step "check-$tag-$c-small" 60 "$bin/hmc-bench" "$c" -g "$dev" --local "$n" -c 1 -n 2 -w 1 $types \
      -b 8 -e 64K -f 32 --timeout 55
    step "check-$tag-$c-large" 90 "$bin/hmc-bench" "$c" -g "$dev" --local "$n" -c 1 -n 2 -w 1 \
      -b 1M -e 1G -f 32 --timeout 85
  done
done

# 5. HMC against NCCL and the CUDA copies.
[ "${COMPARE:-1}" = 0 ] && echo "gpu-check: COMPARE=0: the NCCL and CUDA comparison is left out"
[ "${COMPARE:-1}" = 0 ] || step compare 400 env RUN_TIMEOUT=100 "$root/bench/compare-gpu.sh" --bin "$bin" --out "$out/compare"

# 6. Staged transfers: each rank its own host id, so GPU memory moves through pinned host
#    memory over a network provider (tcp; ucx, which finds shared memory underneath).
#    One chunk as large as the message (no overlap) against chunks whose copies overlap.
for cfg in "tcp:1G" "tcp:4M" "tcp:1M" "ucx:1G" "ucx:4M"; do
  [ "${STAGED:-1}" = 0 ] && break
  IFS=: read -r net chunk <<<"$cfg"
  for pair in gpu-gpu:cuda gpu-cpu:cuda@0; do
    name="staged-$net-${pair%%:*}-$chunk"
    step "$name" 120 env HMC_HOST_ID='h{rank}' HMC_PATH="$net" HMC_STAGE_CHUNK="$chunk" \
      "$bin/hmc-probe" --local 2 -g "${pair#*:}" -b 64M -n 10 --timeout 110 &&
      grep -E '^ +[01] +[01] |^References' "$out/$name.log" | sed "s/^/   $net chunk $chunk: /"
  done
done

echo
echo "gpu-check: $((SECONDS - start)) s; tables in $out/compare/compare-gpu.md, logs in $out"
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-check: FAILED (${#failed[@]}):"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "gpu-check: all steps passed"
