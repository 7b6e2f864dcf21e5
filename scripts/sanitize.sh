#!/usr/bin/env bash
# The whole test suite again, built with sanitizers: AddressSanitizer (with LeakSanitizer)
# and UndefinedBehaviorSanitizer by default, SANITIZE=thread for ThreadSanitizer. The first
# report fails its test. Builds into ${BUILD_DIR:-build-<sanitizer>}, without CUDA (nvcc does
# not take these flags; the GPU suites need a GPU anyway). Extra arguments go to ctest.
# Run scripts/install-deps.sh first on a fresh machine (scripts/test.sh does).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
sanitize=${SANITIZE:-address,undefined}
build=${BUILD_DIR:-$here/build-${sanitize%%,*}}
# -g1: line tables only, which is all a report's stack needs; it builds a quarter faster
# than -g (CI builds three times on two cores).
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHMC_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DHMC_SANITIZE="$sanitize" >/dev/null
cmake --build "$build" -j "${BUILD_JOBS:-$(nproc)}"
# abort_on_error: a report ends the process with a signal, so a multi-process test's
# launcher sees the rank fail. Children inherit these through the environment.
# intercept_tls_get_addr=0: GCC 12's runtime takes some thread-local blocks for glibc 2.19
# ones and LeakSanitizer then faults at exit ("Tracer caught signal 11"), leak or none.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:intercept_tls_get_addr=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# die_after_fork=0: the multi-process tests fork ranks; ThreadSanitizer would refuse threads
# in a child whose parent ever had more than one (Catch, UCX).
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:die_after_fork=0:suppressions=$here/tests/support/tsan.supp}
# UCX's memory hooks take a rwlock inside madvise as a thread exits; ThreadSanitizer faults
# there. The ucx suites pass with those hooks off.
if [[ $sanitize == *thread* ]]; then export UCX_MEM_MMAP_HOOK_MODE=${UCX_MEM_MMAP_HOOK_MODE:-none}; fi
cd "$build"
# Label "timing": cases whose time bounds are calibrated on an uninstrumented build.
# Label "bench": benchmark scripts checked for their columns; their programs (ucx_perftest,
# Open MPI) are not instrumented and the plain run covers them.
# Label "repeat": a suite run again over a second transport or buffer placement whose code
# another test covers (tests/ucx, tests/device); the plain run keeps it.
# Label "bigmem": needs 16 GiB available (skipped below that); the plain run keeps it.
ctest --output-on-failure --timeout 900 -LE "timing|bench|repeat|bigmem" "$@"
