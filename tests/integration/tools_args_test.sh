#!/usr/bin/env bash
# hmc-probe and hmc-bench refuse arguments they cannot honour: each bad command must exit
# non-zero (not by a signal, not by its deadline) with a message that names the cause, and
# leave no rank behind. Every run has a deadline.
#   - sizes: nan, inf, negative; -b with --rotate whose 4 slots overflow a size_t; heap
#     buffers (--memory malloc) the heap cannot give (an error, not std::bad_alloc)
#   - --timeout 0 or negative, --local 1 (a path matrix needs a pair)
#   - a --device rank list naming a rank the job does not have (--local and one rank)
#   - measuring options without --local, `config` with --local
#   - shareable buffers larger than the machine's memory and swap (an error, not the OOM killer)
# SIGTERM to a tool with --local kills its ranks before it ends.
# And two that must run rather than print nonsense:
#   - --lat-iters INT_MAX with a warm-up: the round trips really run (the deadline ends
#     them), not a count overflowed to nothing timed in 0.00 us
#   - -n 25600 of 1 B: the memcpy reference is above zero (the last byte copied is 255,
#     the value the old anti-optimiser sentinel mistook for "not measured")
#
#   tools_args_test.sh path/to/hmc-probe path/to/hmc-bench
set -u
probe_bin=${1:?usage: tools_args_test.sh path/to/hmc-probe path/to/hmc-bench}
bench_bin=${2:?usage: tools_args_test.sh path/to/hmc-probe path/to/hmc-bench}
fail=0
scratch=$(mktemp -d "${TMPDIR:-/tmp}/hmc-tools-args.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
# Copies, so that the leftover check finds this test's ranks only (ranks run as the
# binary's own path); the build's RUNPATH still finds libhmc.
cp "$probe_bin" "$scratch/hmc-probe"
cp "$bench_bin" "$scratch/hmc-bench"
probe=$scratch/hmc-probe
bench=$scratch/hmc-bench
out=$scratch/out

leftovers() {  # leftovers WHAT: no rank of this test's copies may still run
  local left
  left=$(pgrep -af -- "^$scratch/hmc-")
  if [ -n "$left" ]; then echo "FAILED: ranks left after $1:"; echo "$left"; fail=1; fi
}

refused() {  # refused PATTERN CMD...: CMD exits 1-123 (not a signal, not the deadline), PATTERN in its output
  local pattern=$1; shift
  timeout 60 "$@" > "$out" 2>&1
  local rc=$?
  if [ "$rc" -ge 1 ] && [ "$rc" -le 123 ] && grep -Eq -- "$pattern" "$out" &&
     ! grep -Eq "terminate called|Aborted|Segmentation" "$out"; then
    echo "ok: refused (exit $rc): ${*#"$scratch/"}"
  else
    echo "FAILED: ${*#"$scratch/"} (exit $rc, want 1-123 and '$pattern')"; cat "$out"; fail=1
  fi
  leftovers "$*"
}

small=(-n 1 --lat-iters 10 --lat-warmup 0 --timeout 50)

# Sizes.
refused "bad size 'nan'" "$probe" --local 2 -b nan "${small[@]}"
refused "bad size 'inf'" "$probe" --local 2 -b inf "${small[@]}"
refused "bad size '-1K'" "$probe" --local 2 -b -1K "${small[@]}"
refused "with --rotate needs a buffer of 4 x that, more than a size_t holds" \
  "$probe" --local 2 -b 4611686018427388928 --rotate "${small[@]}"
# 2^63 - 2^40 bytes: past any address space, so the heap fails on every machine. Not
# under a sanitizer, whose operator new reports the failure and exits instead of throwing.
if ldd "$probe_bin" | grep -Eq 'lib(asan|tsan)'; then
  echo "skipped under a sanitizer: a heap request past the address space"
else
  refused "out of memory: allocating 9223370937343148032 bytes on the heap failed" \
    "$probe" --local 2 -m malloc -b 8388607T "${small[@]}"
fi
refused "out of memory: .*more than a std::vector holds" "$probe" --local 2 -m malloc -b 16777215T "${small[@]}"
refused "-b: bad size 'nan'" "$bench" all_reduce -b nan -e 8 --local 2
refused "-e: bad size 'inf'" "$bench" all_reduce -b 8 -e inf --local 2
refused "-b: bad size '-8'" "$bench" all_reduce -b -8 -e 8 --local 2

# 2^60 bytes of shareable memory: no machine has them, yet a memfd of that size maps.
refused "more than this machine's memory and swap" "$probe" --local 2 -m shareable -b 1048576T "${small[@]}"
refused "more than this machine's memory and swap" "$bench" all_reduce -m shareable -b 8 -e 1048576T -f 1048576 -n 1 -w 0 --local 2

# Options that would be ignored.
refused "-b measures the pairs that --local N starts" "$probe" -b 4M
refused "--put measures the pairs that --local N starts" "$probe" --put
refused "config prints this machine's table; it does not go with --local" "$probe" --local 2 config
refused "--timeout requires --local" "$bench" all_reduce -b 8 -e 8 --timeout 5
refused "-b: bad size '1.5'" "$bench" all_reduce -b 1.5 -e 8 --local 2
refused "-e: bad size '8i'" "$bench" all_reduce -b 8 -e 8i --local 2
refused "bad size '0x10'" "$probe" --local 2 -b 0x10 "${small[@]}"

# Counts.
refused "--timeout: Value -5 not in range" "$probe" --local 2 --timeout -5 -b 1K -n 1 --lat-iters 10
refused "--timeout: Value 0 not in range" "$probe" --local 2 --timeout 0 -b 1K -n 1 --lat-iters 10
refused "--local: Value 1 not in range 2" "$probe" --local 1

# Device rank lists.
refused "--device 'emu@7': names rank 7, but the job has 2 ranks" "$probe" --local 2 -g emu@7 -b 1K "${small[@]}"
refused "--device 'emu@0-2': names rank 2, but the job has 2 ranks" "$probe" --local 2 -g emu@0-2 -b 1K "${small[@]}"
refused "--device 'emu@5': names rank 5, but the job has 2 ranks" \
  "$bench" all_reduce -b 8 -e 8 -g emu@5 --local 2 --stream
# No launcher: a world of one, checked by the rank itself (pick_device).
refused "--device 'emu@1': names rank 1, but the job has 1 rank" "$bench" all_reduce -b 8 -e 8 -n 1 -w 0 -g emu@1

judged() {  # judged WHAT RC WANT_RC PATTERN: a run that must end with WANT_RC and PATTERN in its output
  local what=$1 rc=$2 want=$3 pattern=$4
  if [ "$rc" -eq "$want" ] && grep -Eq -- "$pattern" "$out"; then
    echo "ok: $what"
  else
    echo "FAILED: $what (exit $rc, want $want and '$pattern')"; cat "$out"; fail=1
  fi
  leftovers "$what"
}

# 2^31 - 1 timed round trips after 10 untimed: still running at the 3 s deadline.
timeout 60 "$probe" --local 2 -b 64K -n 2 --lat-iters 2147483647 --lat-warmup 10 --timeout 3 > "$out" 2>&1
judged "--lat-iters 2147483647 --lat-warmup 10 runs until the deadline" $? 124 "still running after 3 s"

# The memcpy reference at 1 B, 25600 copies (the last writes 255).
timeout 60 "$probe" --local 2 -b 1 -n 25600 --lat-iters 10 --timeout 50 > "$out" 2>&1
judged "memcpy reference above zero at 1 B" $? 0 'memcpy ([0-9]*[1-9][0-9]*\.[0-9]+|[0-9]+\.[0-9]*[1-9][0-9]*) GB/s'

# A size that is no whole unit keeps its fraction in the matrix's header.
timeout 60 "$probe" --local 2 -b 1536K -n 2 --lat-iters 10 --lat-warmup 0 --timeout 50 > "$out" 2>&1
judged "1536K is shown as 1.5 MiB" $? 0 "bandwidth one way with 1\.5 MiB messages"

# SIGTERM while the ranks run: they are killed, and the tool ends with 128 + 15.
"$probe" --local 2 -b 64K -n 2 --lat-iters 2147483647 --lat-warmup 10 --timeout 50 > "$out" 2>&1 &
tool=$!
for _ in $(seq 300); do
  [ "$(pgrep -cf -- "^$scratch/hmc-probe --rank-worker")" -ge 2 ] && break
  sleep 0.1
done
kill -TERM "$tool"
for _ in $(seq 100); do kill -0 "$tool" 2>/dev/null || break; sleep 0.1; done
kill -KILL "$tool" 2>/dev/null
wait "$tool"
judged "SIGTERM kills the ranks first" $? 143 "Terminated; killing 2 rank\(s\)"
exit $fail
