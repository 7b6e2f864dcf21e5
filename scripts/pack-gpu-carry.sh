#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh needs and packs it into one folder that a GPU machine
# without Debian's packages can run from (it has CUDA, NCCL and a driver; not spdlog, fmt,
# UCX, ibverbs ...):
#
#   bin/        hmc-bench, hmc-probe, hmc-gpu-ref, hmc-cuda-waits and the binaries of the GPU-labelled tests;
#               ucx_perftest and ucx_info where ucx-utils is installed (bench/compare-ucx.sh --build CARRY)
#   lib/        libhmc.so and every provider (cuda and nccl included), lib/test-providers/ (emu)
#   deps/       the Debian shared libraries those need (ldd), minus libc, CUDA and NCCL;
#   deps/compat libstdc++ and libgcc_s, used only where the machine's own are too old
#   gpu-tests.sh  the `ctest -L gpu` tests as plain commands on this folder (ctest needs
#               the build tree; this needs neither cmake nor the tree)
#   MANIFEST    commit, date, build, sizes, the newest glibc symbol version needed
#
#   scripts/pack-gpu-carry.sh [CARRY]     default CARRY: <repo>/.carry-gpu
#   BUILD_DIR=/work/build-bench scripts/pack-gpu-carry.sh
#
# Debug info is stripped; the folder stays well under 64 MiB (what a device run carries).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${BUILD_DIR:-$root/build}")
carry=$(realpath -m "${1:-$root/.carry-gpu}")
label=${GPU_TEST_LABEL:-gpu}

if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake "$build" >/dev/null  # pick up new sources (and CUDA, if it appeared)
ninja -C "$build" hmc hmc-bench hmc-probe hmc-net-shm hmc-net-tcp
left_out=()  # optional pieces that are not here or do not build now: not carried
for t in hmc-device-cuda hmc-ccl-nccl hmc-gpu-ref hmc-cuda-waits hmc-device-emu hmc-net-ucx; do
  if ! ninja -C "$build" -t query "$t" >/dev/null 2>&1; then echo "pack: no target $t here"; left_out+=("$t")
  elif ! ninja -C "$build" "$t"; then echo "pack: WARNING: $t does not build; left out" >&2; left_out+=("$t"); fi
done
[ -f "$build/lib/libhmc-device-cuda.so" ] || echo "pack: WARNING: no cuda provider built (is nvcc at /usr/local/cuda?)" >&2
[ -f "$build/bin/hmc-gpu-ref" ] || echo "pack: WARNING: no hmc-gpu-ref built (CUDA and NCCL needed)" >&2

# The GPU-labelled tests: ctest names their commands only once the programs exist, so the
# ones it cannot find are built first (plus GPU_TEST_TARGETS), then every test must have one.
mapfile -t missing < <(ctest --test-dir "$build" -L "$label" -N 2>&1 |
                       sed -n "s|^Could not find executable $build/bin/\(.*\)|bin/\1|p" | sort -u)
for t in ${GPU_TEST_TARGETS:-} "${missing[@]}"; do ninja -C "$build" "$t"; done
tests_json=$(mktemp)
trap 'rm -f "$tests_json"' EXIT
ctest --test-dir "$build" -L "$label" --show-only=json-v1 >"$tests_json"
bins=$(python3 -c '
import json, sys
build = sys.argv[1]
for t in json.load(open(sys.argv[2])).get("tests", []):
    c = t.get("command")
    if not c: sys.exit("pack: test %s has no program built (add its target to GPU_TEST_TARGETS)" % t["name"])
    if c[0].startswith(build + "/bin/"): print(c[0][len(build) + 5:])
' "$build" "$tests_json")
mapfile -t test_bins < <(sort -u <<<"$bins" | grep .)
# Programs that already existed were not rebuilt above: bring them up to date too.
[ ${#test_bins[@]} -eq 0 ] || ninja -C "$build" "${test_bins[@]/#/bin/}"

rm -rf "$carry"
mkdir -p "$carry/bin" "$carry/lib/test-providers" "$carry/deps/compat"
for f in hmc-bench hmc-probe hmc-gpu-ref hmc-cuda-waits "${test_bins[@]}"; do
  [ -f "$build/bin/$f" ] && cp "$build/bin/$f" "$carry/bin/"
done
for tool in ucx_perftest ucx_info; do
  path=$(command -v "$tool" || true)
  [ -n "$path" ] && cp "$path" "$carry/bin/"
done
cp "$build"/lib/libhmc*.so "$carry/lib/"
cp "$build"/lib/test-providers/*.so "$carry/lib/test-providers/" 2>/dev/null || true
for t in "${left_out[@]}"; do rm -f "$carry/bin/$t" "$carry/lib/lib$t.so" "$carry/lib/test-providers/lib$t.so"; done
find "$carry/bin" "$carry/lib" -type f -exec strip --strip-debug {} +

# Shared libraries the GPU machine lacks: everything ldd resolves outside the build, except
# the C library family, the driver, NCCL and CUDA's own (the machine has those, matched
# to its driver). libstdc++/libgcc_s go to compat/ (gpu-check uses them only if needed).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libcuda\.so|libnccl\.so|libnvidia-)'
while read -r name path; do
  [[ $name =~ $skip ]] && continue
  if [[ $name =~ ^(libstdc\+\+|libgcc_s) ]]; then cp -L "$path" "$carry/deps/compat/$name"
  else cp -L "$path" "$carry/deps/$name"; fi
done < <(find "$carry/bin" "$carry/lib" -type f -exec ldd {} \; 2>/dev/null |
         awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | grep -v " $build/" | sort -u)
# UCX finds its transports next to libucs (ucx/); carry them if the ucx provider came along.
if [ -f "$carry/deps/libucs.so.0" ]; then
  ucx_dir=$(dirname "$(ldd "$carry/lib/libhmc-net-ucx.so" | awk '$1 == "libucs.so.0" {print $3}')")/ucx
  if [ -d "$ucx_dir" ]; then
    mkdir -p "$carry/deps/ucx"
    cp -L "$ucx_dir"/libuct_{cma,ib,rdmacm}.so* "$carry/deps/ucx/" 2>/dev/null || true
  fi
fi
find "$carry/deps" -type f -exec strip --strip-debug {} + 2>/dev/null || true

python3 - "$build" "$root" "$carry/gpu-tests.sh" "$label" "$tests_json" <<'EOF'
import json, shlex, sys
build, src, out, label, manifest = sys.argv[1:6]
def q(s):  # quoted for bash, the build folder as "$CARRY" and the source tree as "$ROOT"
    def qsrc(p): return '"$ROOT"'.join(shlex.quote(x) if x else "" for x in p.split(src))
    return '"$CARRY"'.join(qsrc(p) for p in s.split(build)) or "''"
lines = []
for t in json.load(open(manifest)).get("tests", []):
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    env = props.get("ENVIRONMENT", [])
    limit = int(float(props.get("TIMEOUT", 600)))
    skip = props.get("SKIP_RETURN_CODE", "")
    wd = props.get("WORKING_DIRECTORY", build)
    lines.append("t %s %d %s %s %s" % (shlex.quote(t["name"]), limit, shlex.quote(str(skip)) if skip != "" else "''",
                                     q(wd), " ".join(q(x) for x in list(env) + list(t["command"]))))
with open(out, "w") as f:
    f.write('''#!/usr/bin/env bash
# Generated by scripts/pack-gpu-carry.sh: the `ctest -L %s` tests of the build, as commands
# on this carry folder. Usage: gpu-tests.sh LOGDIR [MAX_SECONDS_PER_TEST]
# A test that exits with its skip code counts as failed: on a GPU machine nothing may skip.
# ONLY=REGEX runs the tests whose name matches it; WRAP="PROGRAM ARGS" runs each test's
# program under PROGRAM (compute-sanitizer, for scripts/gpu-sanitize.sh).
CARRY=${CARRY:-$(cd "$(dirname "$0")" && pwd)}
ROOT=${ROOT:-$(pwd)}
logdir=${1:-.}
cap=${2:-600}
mkdir -p "$logdir"
failed=0
t() {
  local name=$1 limit=$2 skip=$3 dir=$4
  shift 4
  [ -n "${ONLY:-}" ] && ! [[ $name =~ $ONLY ]] && return 0
  [ "$limit" -gt "$cap" ] && limit=$cap
  local vars=()
  while [ $# -gt 0 ] && [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do vars+=("$1"); shift; done
  mkdir -p "$dir"
  echo "== $name: ${vars[*]} ${WRAP:-}${WRAP:+ }$*" >"$logdir/$name.log"
  # shellcheck disable=SC2086  # WRAP is a command line, split on purpose
  (cd "$dir" && timeout -k 10 "$limit" env "${vars[@]}" ${WRAP:-} "$@") >>"$logdir/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then echo "PASS $name"
  elif [ -n "$skip" ] && [ $rc -eq "$skip" ]; then echo "SKIPPED $name (exit $rc: see $logdir/$name.log)"; failed=1
  else echo "FAIL $name (exit $rc$([ $rc -eq 124 ] && echo ", timed out after $limit s"))"; failed=1; fi
}
''' % label)
    f.write("\n".join(lines) + "\n")
    f.write('[ %d -gt 0 ] || { echo "no tests labelled %s in the build"; failed=1; }\nexit $failed\n' % (len(lines), label))
EOF
chmod +x "$carry/gpu-tests.sh"

newest_glibc() { xargs objdump -T 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1; }
glibc=$(find "$carry/bin" "$carry/lib" "$carry/deps" -path "$carry/deps/compat" -prune -o -type f -print | newest_glibc)
glibc_compat=$(find "$carry/deps/compat" -type f | newest_glibc)
{
  echo "commit: $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "packed: $(date -u +%FT%TZ) from $build"
  echo "newest glibc symbol needed: $glibc (the GPU machine's libc must be at least that; deps/compat: $glibc_compat)"
  echo "tests ($label): $(grep -c '^t ' "$carry/gpu-tests.sh")"
  echo "left out: ${left_out[*]:-nothing}"
  (cd "$carry" && find . -type f | sort | xargs ls -l | awk '{printf "%10d %s\n", $5, $9}')
} >"$carry/MANIFEST"

# The carry folder never belongs in git.
exclude="$(git -C "$root" rev-parse --git-path info/exclude 2>/dev/null || true)"
if [ -n "$exclude" ] && [[ $carry == "$root"/* ]]; then
  rel=/${carry#"$root"/}/
  (cd "$root" && mkdir -p "$(dirname "$exclude")" && { grep -qxF "$rel" "$exclude" 2>/dev/null || echo "$rel" >>"$exclude"; })
fi
echo "pack: $carry: $(du -sh "$carry" | cut -f1), $(find "$carry/bin" -type f | wc -l) programs, $(find "$carry/deps" -type f | wc -l) libraries; $glibc"
