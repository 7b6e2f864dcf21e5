#!/usr/bin/env bash
# HMC against Open MPI and Gloo on this machine's CPUs, side by side, in one go.
#
#   bench/compare-cpu.sh [--build DIR] [--out DIR] [--ranks "2 4"] [--colls "all_reduce all_gather all_to_all"]
#
# Builds hmc-bench (cmake + ninja, if needed) and the two reference programs (into
# DIR/bench-cpu, never the source tree), then runs all three for every collective and
# rank count over the same sizes: 8 B to 16 MiB in x8 steps, and 64 MiB. Every program
# times a size the same way: warm-up calls, a barrier, N timed calls, each waited for;
# time = elapsed / N per rank, the max over ranks. all_reduce sums float32; all_gather and
# all_to_all move bytes (size = total bytes, as nccl-tests counts them). Every size's
# result is also checked once on known data. Prints the table and writes it as markdown
# and CSV to OUT (default DIR/compare-cpu). Each run has a deadline (RUN_TIMEOUT, s);
# Ctrl-C or a failure stops and reaps whatever runs. Needs scripts/install-deps.sh.
#
# Every run is repeated REPEAT times, the three programs taking turns, and the table keeps
# each size's fastest run: on a shared machine that filters out other people's load.
#
# Environment: ITERS_TINY/WARMUP_TINY (8 B to 4 KiB, default 1000/100: a few microseconds
# a call need many calls to average out), ITERS_MID/WARMUP_MID (32 KiB and 256 KiB, default
# 500/50: tens of microseconds a call, where 20 calls measured mostly the first ones' cold
# start), ITERS/WARMUP (2 MiB and 16 MiB, default 20/5), ITERS_LARGE/WARMUP_LARGE (64 MiB,
# default 10/3), REPEAT (default 3), RUN_TIMEOUT
# (default 600). MEMORY=shareable gives hmc-bench buffers from Context::alloc's kShareable
# (memory the shm provider maps into its peers) instead of its default host memory, which
# shm reaches with process_vm_writev.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$src/build"
out=""
ranks_list="2 4"
colls="all_reduce all_gather all_to_all"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --ranks) ranks_list=$2; shift 2 ;;
    --colls) colls=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "compare-cpu: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
out=${out:-$build/compare-cpu}
iters_tiny=${ITERS_TINY:-1000} warmup_tiny=${WARMUP_TINY:-100}
iters_mid=${ITERS_MID:-500} warmup_mid=${WARMUP_MID:-50}
iters=${ITERS:-20} warmup=${WARMUP:-5}
iters_large=${ITERS_LARGE:-10} warmup_large=${WARMUP_LARGE:-3}
run_timeout=${RUN_TIMEOUT:-600}
repeat=${REPEAT:-3}
tiny=(-b 8 -e 4K -f 8 -n "$iters_tiny" -w "$warmup_tiny")
mid=(-b 32K -e 256K -f 8 -n "$iters_mid" -w "$warmup_mid")
small=(-b 2M -e 16M -f 8 -n "$iters" -w "$warmup")
large=(-b 64M -e 64M -f 2 -n "$iters_large" -w "$warmup_large")

mkdir -p "$out/raw" "$build/bench-cpu"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/compare-cpu.XXXXXX")
current=""
cleanup() {
  if [ -n "$current" ] && kill -0 "$current" 2>/dev/null; then
    kill -TERM "$current" 2>/dev/null || true  # timeout passes it on to the whole run
    wait "$current" 2>/dev/null || true
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Runs "$@" under a deadline in the background, so a signal here can stop it; output to $log.
run_with_deadline() {
  local log=$1; shift
  TMPDIR=$scratch timeout -k 10 "$run_timeout" "$@" >"$log" 2>"$log.err" &
  current=$!
  local rc=0
  wait "$current" || rc=$?
  current=""
  return $rc
}

note() { echo "compare-cpu: $*" >&2; }

# --- build ---------------------------------------------------------------------------
have_hmc=1 have_mpi=1 have_gloo=1
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$src" -B "$build" -G Ninja >"$out/build-hmc.log" 2>&1 || true
fi
if ! timeout 1800 ninja -C "$build" -j"$(nproc)" hmc-bench >>"$out/build-hmc.log" 2>&1; then
  have_hmc=0
  note "hmc-bench did not build (see $out/build-hmc.log); its column reads n/a"
fi
mpi_bin="$build/bench-cpu/mpi_bench" gloo_bin="$build/bench-cpu/gloo_bench"
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  have_mpi=0; note "no mpicc/mpirun: run scripts/install-deps.sh (libopenmpi-dev openmpi-bin)"
elif [ ! -x "$mpi_bin" ] || [ "$src/bench/mpi_bench.c" -nt "$mpi_bin" ] || [ "$src/bench/size_arg.h" -nt "$mpi_bin" ]; then
  mpicc -O2 -o "$mpi_bin" "$src/bench/mpi_bench.c" || { have_mpi=0; note "mpi_bench did not build"; }
fi
if [ ! -f /usr/include/gloo/allreduce.h ]; then
  have_gloo=0; note "no Gloo headers: run scripts/install-deps.sh (libgloo-dev)"
elif [ ! -x "$gloo_bin" ] || [ "$src/bench/gloo_bench.cpp" -nt "$gloo_bin" ]; then
  g++ -std=c++17 -O2 -o "$gloo_bin" "$src/bench/gloo_bench.cpp" -lgloo -pthread || { have_gloo=0; note "gloo_bench did not build"; }
fi

# --- runs: each tool's output becomes "size,time_us,wrong" lines ------------------------
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
hmc_dtype() { [ "$1" = all_reduce ] && echo "-d float32 -o sum" || echo "-d uint8"; }

measure() {  # tool coll ranks -> appended to $out/raw/tool-coll-ranks.csv
  local tool=$1 coll=$2 n=$3 dest="$out/raw/$1-$2-$3.csv" part
  for part in tiny mid small large; do
    local -a sizes=("${small[@]}")
    [ "$part" = tiny ] && sizes=("${tiny[@]}")
    [ "$part" = mid ] && sizes=("${mid[@]}")
    [ "$part" = large ] && sizes=("${large[@]}")
    local log="$scratch/$tool-$coll-$n-$part"
    case "$tool" in
      hmc)
        # shellcheck disable=SC2046
        run_with_deadline "$log" "$build/bin/hmc-bench" "$coll" --local "$n" "${sizes[@]}" $(hmc_dtype "$coll") \
          -m "${MEMORY:-default}" -c 1 --csv --timeout "$run_timeout" || { note "hmc $coll $n ranks ($part) failed: $(tail -n 3 "$log.err")"; continue; }
        awk -F, 'NR > 1 { print $3 "," $8 "," ($11 == "" ? 0 : $11) }' "$log" >>"$dest" ;;
      ompi)
        run_with_deadline "$log" mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" "$mpi_bin" "$coll" \
          "${sizes[@]}" || { note "Open MPI $coll $n ranks ($part) failed: $(tail -n 3 "$log.err")"; continue; }
        awk -F, 'NR > 1 { print $3 "," $5 "," $6 }' "$log" >>"$dest" ;;
      gloo)
        run_with_deadline "$log" "$gloo_bin" -np "$n" "$coll" "${sizes[@]}" --timeout "$run_timeout" \
          || { note "Gloo $coll $n ranks ($part) failed: $(tail -n 3 "$log.err")"; continue; }
        awk -F, 'NR > 1 { print $3 "," $5 "," $6 }' "$log" >>"$dest" ;;
    esac
  done
}

for coll in $colls; do
  for n in $ranks_list; do
    for tool in hmc ompi gloo; do : >"$out/raw/$tool-$coll-$n.csv"; done
    for rep in $(seq "$repeat"); do
      note "$coll, $n ranks, run $rep of $repeat"
      [ $have_hmc = 0 ] || measure hmc "$coll" "$n"
      [ $have_mpi = 0 ] || measure ompi "$coll" "$n"
      [ $have_gloo = 0 ] || measure gloo "$coll" "$n"
    done
  done
done

# --- the table ---------------------------------------------------------------------------
md="$out/compare-cpu.md" csv="$out/compare-cpu.csv"
{
  echo "Machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(uname -sr)"
  echo "Date: $(date -u '+%Y-%m-%d %H:%M UTC'); load average before the table: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "HMC buffers: Context::alloc ${MEMORY:-default} (hmc-bench -m)"
  echo "Open MPI: $(mpirun --version 2>/dev/null | head -n1 || echo none); Gloo: Debian $(dpkg-query -W -f='${Version}' libgloo-dev 2>/dev/null || echo none)"
  echo "Iterations: ${iters_tiny} (+${warmup_tiny} warm-up) up to 4 KiB, ${iters_mid} (+${warmup_mid}) at 32 and 256 KiB, ${iters} (+${warmup}) at 2 and 16 MiB, ${iters_large} (+${warmup_large}) at 64 MiB; time = max over ranks of the mean per call, fastest of ${repeat} runs."
  echo "HMC/OMPI > 1: HMC slower than Open MPI; Gloo/HMC > 1: HMC faster than Gloo. '!' marks a size whose check failed."
} >"$md"
echo "collective,ranks,size,hmc_us,ompi_us,gloo_us,hmc_over_ompi,gloo_over_hmc" >"$csv"
for coll in $colls; do
  for n in $ranks_list; do
    printf '\n### %s, %s ranks\n\n| size (B) | HMC (us) | Open MPI (us) | Gloo (us) | HMC/OMPI | Gloo/HMC |\n|---:|---:|---:|---:|---:|---:|\n' \
      "$coll" "$n" >>"$md"
    for tool in hmc ompi gloo; do [ -f "$out/raw/$tool-$coll-$n.csv" ] || : >"$out/raw/$tool-$coll-$n.csv"; done
    awk -F, -v coll="$coll" -v n="$n" -v md="$md" -v csv="$csv" '
      function cell(t, s) { return (t, s) in time ? sprintf("%.1f%s", time[t, s], wrong[t, s] ? "!" : "") : "n/a" }
      function ratio(a, b, s) { return ((a, s) in time && (b, s) in time && time[b, s] > 0) ? sprintf("%.3g", time[a, s] / time[b, s]) : "n/a" }
      { tool = FILENAME == ARGV[1] ? 1 : FILENAME == ARGV[2] ? 2 : 3 }
      { if (!((tool, $1) in time) || $2 + 0 < time[tool, $1] + 0) time[tool, $1] = $2
        wrong[tool, $1] += $3; if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
      END {
        for (i = 1; i <= k; ++i) for (j = i + 1; j <= k; ++j) if (order[j] + 0 < order[i] + 0) { x = order[i]; order[i] = order[j]; order[j] = x }
        for (i = 1; i <= k; ++i) {
          s = order[i]
          printf "| %s | %s | %s | %s | %s | %s |\n", s, cell(1, s), cell(2, s), cell(3, s), ratio(1, 2, s), ratio(3, 1, s) >> md
          printf "%s,%s,%s,%s,%s,%s,%s,%s\n", coll, n, s, cell(1, s), cell(2, s), cell(3, s), ratio(1, 2, s), ratio(3, 1, s) >> csv
        }
      }' "$out/raw/hmc-$coll-$n.csv" "$out/raw/ompi-$coll-$n.csv" "$out/raw/gloo-$coll-$n.csv"
  done
done
cat "$md"
echo
note "written $md and $csv"
