#!/usr/bin/env bash
# Checks that on a machine without an NVIDIA GPU a CUDA plugin (the cuda device provider,
# the nccl collective provider) loads, says "unavailable" with the reason, and that
# everything else keeps working:
#   check-unavailable.sh HMC_PROBE PLUGIN NAME KIND
# Exit 0 when so, 77 (CTest skip) when a GPU is visible, 1 otherwise: the plugin
# missing, hmc-probe crashing, NAME not listed, or NAME listed as available.
set -u
probe=$1
plugin=$2
name=${3:-cuda}
kind=${4:-device}
if [[ -e /dev/nvidia0 ]] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }; then
  echo "SKIPPED: an NVIDIA GPU is visible here (/dev/nvidia0 or nvidia-smi -L); this test is for machines without one"
  exit 77
fi
[[ -f $plugin ]] || { echo "FAIL: $plugin was not built"; exit 1; }
out=$(HMC_PROVIDER_PATH=$(dirname "$plugin") "$probe" 2>&1)
rc=$?
echo "$out"
if (( rc != 0 )); then
  echo "FAIL: hmc-probe exited with $rc"
  exit 1
fi
row=$(grep -E "^ +$name +$kind " <<<"$out")
if [[ -z $row ]]; then
  echo "FAIL: hmc-probe does not list the $name $kind provider"
  exit 1
fi
if ! grep -Eq ' no .*unavailable: no (CUDA (driver|device)|NCCL): .+' <<<"$row"; then
  echo "FAIL: $name is not reported unavailable with a reason: $row"
  exit 1
fi
if ! grep -Eq '^ +cpu +device .* available ' <<<"$out"; then
  echo "FAIL: the cpu device provider is not available next to an unavailable $name"
  exit 1
fi
echo "OK: $row"
