#!/usr/bin/env bash
# HMC against NCCL on this machine's GPUs, in one run: hmc-bench --device cuda (2 ranks,
# --local 2) as it comes (HMC_CCL=auto: two GPU ranks delegate to NCCL through the nccl
# collective provider) and with HMC_CCL=off (HMC's own device paths, "native"), and
# hmc-gpu-ref (NCCL, same collectives and sizes), then hmc-probe with GPU
# buffers (GPU<->GPU) and one GPU rank with one CPU rank (GPU<->CPU) against cudaMemcpyPeer
# and pinned cudaMemcpy. Tables (markdown) go to OUT/compare-gpu.md, raw JSON to OUT/raw/.
#
#   bench/compare-gpu.sh [--bin DIR] [--out DIR] [-b 8] [-e 1G] [-f 2] [--colls "all_reduce ..."]
#   ITERS=20 WARMUP=5 CHECK=0 P2P_SIZES="64M 256M 1G" P2P_ITERS=100 RUN_TIMEOUT=240 bench/compare-gpu.sh
#   (point-to-point: P2P_ITERS messages per pair and as many copies for the CUDA references;
#   HMC's run also pays its first handshake and a final acknowledgement, which 20 messages
#   of 64 MiB did not amortise: 0.89-0.99 of cudaMemcpyPeer against 0.97-1.00 with 100)
#   NATIVE=0 bench/compare-gpu.sh ...      without the HMC_CCL=off runs
#   BLOCKING=1 bench/compare-gpu.sh ...    hmc-bench waits for each call (-z 1); by default it
#                                          issues them back to back (-z 0), as hmc-gpu-ref and
#                                          nccl-tests time NCCL
#   DEVICE=emu bench/compare-gpu.sh ...    HMC side on another device provider (a dry run in CI)
#
# DIR holds hmc-bench, hmc-probe and hmc-gpu-ref (default: build/bin); libhmc and the cuda
# provider must be found by them (a build tree, or LD_LIBRARY_PATH as scripts/gpu-check.sh
# sets it); BIN and OUT set the same as --bin and --out. NCCL_NVLS_ENABLE=0 always. Exit
# status: non-zero when a run failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${BIN:-$here/../build/bin}
out=${OUT:-compare-gpu-out}
minb=8 maxb=1G factor=2
colls="all_reduce all_gather reduce_scatter all_to_all sendrecv"
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -b) minb=$2; shift 2 ;;
    -e) maxb=$2; shift 2 ;;
    -f) factor=$2; shift 2 ;;
    --colls) colls=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "compare-gpu: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
iters=${ITERS:-20} warmup=${WARMUP:-5} check=${CHECK:-0} p2p_sizes=${P2P_SIZES:-"64M 256M 1G"}
p2p_iters=${P2P_ITERS:-100} blocking=${BLOCKING:-0}
run_timeout=${RUN_TIMEOUT:-240} device=${DEVICE:-cuda}
export NCCL_NVLS_ENABLE=0
mkdir -p "$out/raw"
failed=()

# run NAME CMD...: stdout to raw/NAME.json, stderr to raw/NAME.err, bounded by RUN_TIMEOUT.
run() {
  local name=$1; shift
  echo "compare-gpu: $name: $*" >&2
  timeout -k 10 "$run_timeout" "$@" >"$out/raw/$name.json" 2>"$out/raw/$name.err"
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "compare-gpu: $name failed (exit $rc; $out/raw/$name.err):" >&2
    tail -5 "$out/raw/$name.err" >&2
    failed+=("$name")
  fi
}

p2p_min=${p2p_sizes%% *} p2p_max=${p2p_sizes##* }
run nccl "$bin/hmc-gpu-ref" -g 2 -b "$minb" -e "$maxb" -f "$factor" -n "$iters" -w "$warmup" \
  --colls "${colls// /,}" --no-p2p --json
run p2p-ref "$bin/hmc-gpu-ref" -g 2 --no-nccl -n "$p2p_iters" -w "$warmup" --p2p-b "$p2p_min" --p2p-e "$p2p_max" --json
for c in $colls; do
  run "hmc-$c" "$bin/hmc-bench" "$c" -g "$device" --local 2 -b "$minb" -e "$maxb" -f "$factor" -n "$iters" \
    -w "$warmup" -c "$check" -z "$blocking" --timeout "$run_timeout" --json
  [ "$c" = sendrecv ] || [ "${NATIVE:-1}" = 0 ] && continue  # sendrecv is never delegated: one run says it all
  run "native-$c" env HMC_CCL=off "$bin/hmc-bench" "$c" -g "$device" --local 2 -b "$minb" -e "$maxb" -f "$factor" \
    -n "$iters" -w "$warmup" -c "$check" -z "$blocking" --timeout "$run_timeout" --json
done
for s in $p2p_sizes; do
  run "probe-gpu-gpu-$s" "$bin/hmc-probe" --local 2 -g "$device" -b "$s" -n "$p2p_iters" --lat-iters 200 --json --timeout "$run_timeout"
  run "probe-gpu-cpu-$s" "$bin/hmc-probe" --local 2 -g "$device@0" -b "$s" -n "$p2p_iters" --lat-iters 200 --json --timeout "$run_timeout"
done

python3 - "$out" "$colls" "$p2p_sizes" "$device" "$p2p_iters" "$blocking" <<'EOF' | tee "$out/compare-gpu.md"
import json, os, sys
out, colls, p2p_sizes, device = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4]
def load(name):
    try:
        with open(os.path.join(out, "raw", name + ".json")) as f: return json.load(f)
    except (OSError, ValueError): return None
def num(text):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * m[text[-1].upper()] if text[-1].upper() in m else int(text)
def f(v, fmt="%.2f"): return "-" if v is None else fmt % v
def ratio(a, b): return a / b if a is not None and b else None
nccl = load("nccl") or {}
print("# HMC vs NCCL on GPUs\n")
print("NCCL %s, NCCL_NVLS_ENABLE=%s, GPUs: %s. HMC: hmc-bench --device %s --local 2 -z %s (out-of-place; "
      "in-place in its own column), as it comes (HMC_CCL=auto: delegated to NCCL) and native (HMC_CCL=off: "
      "HMC's own device paths); NCCL: hmc-gpu-ref, one process, ncclCommInitAll. busbw as nccl-tests.\n"
      % (nccl.get("nccl_version", "?"), nccl.get("nvls_enable", "?"), "; ".join(nccl.get("gpus", [])) or "?", device,
         sys.argv[6]))
summary = []
for c in colls:
    ref = {r["size"]: r for r in nccl.get("collectives", []) if r["collective"] == c}
    hmc = load("hmc-" + c) or {}
    native = {r["size"]: r.get("out_of_place") or {} for r in (load("native-" + c) or {}).get("rows", [])}
    print("## %s, 2 ranks\n" % c)
    print("| size (B) | HMC time (us) | NCCL time (us) | HMC busbw | HMC in-place busbw | NCCL busbw | HMC/NCCL busbw "
          "| native time (us) | native busbw | native/NCCL |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    big, big_native = [], []
    for row in hmc.get("rows", []):
        o, i, n = row.get("out_of_place") or {}, row.get("in_place") or {}, ref.get(row["size"], {})
        v = native.get(row["size"], {})
        r, rv = ratio(o.get("busbw_gbps"), n.get("busbw_gbps")), ratio(v.get("busbw_gbps"), n.get("busbw_gbps"))
        if row["size"] >= 64 << 20 and r is not None: big.append(r)
        if row["size"] >= 64 << 20 and rv is not None: big_native.append(rv)
        wrong = " (wrong %d)" % o["wrong"] if o.get("wrong") else ""
        wrong_native = " (wrong %d)" % v["wrong"] if v.get("wrong") else ""
        print("| %d | %s%s | %s | %s | %s | %s | %s | %s%s | %s | %s |" % (row["size"], f(o.get("time_us")), wrong,
              f(n.get("time_us")), f(o.get("busbw_gbps")), f(i.get("busbw_gbps")), f(n.get("busbw_gbps")), f(r, "%.3f"),
              f(v.get("time_us")), wrong_native, f(v.get("busbw_gbps")), f(rv, "%.3f")))
    if not hmc: print("| no HMC result (see raw/hmc-%s.err) | | | | | | | | | |" % c)
    print()
    if big: summary.append("%s: HMC/NCCL busbw at >= 64 MiB: min %.3f (target >= 0.90)" % (c, min(big)))
    if big_native: summary.append("%s native (HMC_CCL=off): HMC/NCCL busbw at >= 64 MiB: min %.3f" % (c, min(big_native)))
    if c == "all_reduce" and hmc.get("rows") and hmc["rows"][0]["size"] == 8 and 8 in ref:
        t = hmc["rows"][0]["out_of_place"]["time_us"] / ref[8]["time_us"]
        summary.append("all_reduce 8 B: HMC/NCCL time %.2f (target <= 2)" % t)
        if 8 in native and native[8].get("time_us"):
            summary.append("all_reduce 8 B native: HMC/NCCL time %.2f" % (native[8]["time_us"] / ref[8]["time_us"]))
p2p = {}
for r in (load("p2p-ref") or {}).get("p2p", []): p2p[(r["test"], r["size"])] = r["gbps"]
print("## Point-to-point (hmc-probe --local 2, one way, 4 messages in flight; %s messages, as many CUDA copies)\n"
      % sys.argv[5])
print("| size (B) | pair | HMC path | HMC GB/s | reference | reference GB/s | HMC/reference |")
print("|---:|---|---|---:|---|---:|---:|")
for s in p2p_sizes:
    size = num(s)
    for kind in ("gpu-gpu", "gpu-cpu"):
        j = load("probe-%s-%s" % (kind, s))
        if not j:
            print("| %d | %s | failed (raw/probe-%s-%s.err) | | | | |" % (size, kind, kind, s)); continue
        for p in j["pairs"]:
            if kind == "gpu-gpu": ref = ("cudaMemcpyPeer 0->1", "memcpy_peer_0to1")
            elif p["from_device"].startswith("cpu"): ref = ("pinned H2D", "pinned_h2d")
            else: ref = ("pinned D2H", "pinned_d2h")
            g = p2p.get((ref[1], size))
            r = ratio(p["bandwidth_gbps"], g)
            path = p["provider"] + (" (%s)" % p["device_path"] if p.get("device_path") else "")
            print("| %d | rank %d %s -> rank %d %s | %s | %.2f | %s | %s | %s |" % (size, p["from"], p["from_device"], p["to"],
                  p["to_device"], path, p["bandwidth_gbps"], ref[0], f(g), f(r, "%.3f")))
            if size >= 64 << 20 and r is not None:
                summary.append("%s %d -> %d at %s: %.3f of %s (target >= %s)" % (kind, p["from"], p["to"], s, r, ref[0],
                               "0.95" if kind == "gpu-gpu" else "0.80"))
bidir = [(s, g) for (t, s), g in sorted(p2p.items()) if t == "memcpy_peer_bidir"]
if bidir: print("\ncudaMemcpyPeer both ways at once: " + ", ".join("%d B %.1f GB/s" % x for x in bidir))
print("\n## Against the issue's targets\n")
for line in summary: print("- " + line)
EOF
if [ ${#failed[@]} -gt 0 ]; then
  echo "compare-gpu: failed runs: ${failed[*]}" >&2
  exit 1
fi
