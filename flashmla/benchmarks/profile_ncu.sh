#!/usr/bin/env bash
# Nsight Compute profiles of the decode kernels, one device call (from the repository root):
#     bash flashmla/benchmarks/profile_ncu.sh OUTDIR [CASES]
# CASES: profile_decode.py --cases (default: FP8 and BF16 cache at batch 64, 16384 keys, 128 rows, and
# FP8 at 64 and 16 rows), i.e. the FP8 wgmma kernel where it runs at 0.50-0.57x the BF16 one, the BF16
# wgmma kernel beside it, and the swap-AB kernel. Writes OUTDIR/ncu.log (the build, each case's check,
# ncu's per-kernel details: speed of light, memory, warp states, scheduler, launch and occupancy) and
# OUTDIR/ncu.ncu-rep. Clocks are left as found (--clock-control none).
set -uo pipefail
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"
CASES=${2:-fp8:64:16384:128,bf16:64:16384:128,fp8:64:16384:64,fp8:64:16384:16}
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONUNBUFFERED=1
{
  python3 -m pip install -q --no-build-isolation --no-deps ./flashmla 2>&1 | tail -3
  echo "build rc=$?"
  timeout 400 ncu --clock-control none --profile-from-start off --target-processes all \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section LaunchStats --section Occupancy \
    --export "$OUT/ncu" --force-overwrite \
    python3 flashmla/benchmarks/profile_decode.py --cases "$CASES"
  echo "ncu rc=$?"
  # --export keeps the details out of the console: print them from the report
  ncu --import "$OUT/ncu.ncu-rep" --page details --print-units base
} > "$OUT/ncu.log" 2>&1
tail -150 "$OUT/ncu.log"
