#!/usr/bin/env bash
# Nsight Compute beside cuBLAS, one device call (from the repository root; ~3 min):
#     bash deepgemm/scripts/profile_ncu.sh OUTDIR [SHAPES]
# SHAPES: profile_gemm.py --shapes (default: the large dense shapes where we trail cuBLAS blockwise,
# 0.96-0.97x, and N = 2112 at 0.78x). Writes OUTDIR/ncu.log (each shape's check, then per kernel:
# speed of light, memory, warp states, scheduler, launch and occupancy) and OUTDIR/ncu.ncu-rep.
# Clocks are left as found (--clock-control none).
set -uo pipefail
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"
SHAPES=${2:-4096x4096x7168,4096x7168x16384,4096x2112x7168}
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONUNBUFFERED=1 DEEPGEMM_CACHE_DIR=/tmp/dgcache
{
  python3 -m pip install -q --no-build-isolation --no-deps ./deepgemm 2>&1 | tail -3
  echo "install rc=$?"
  timeout 400 ncu --clock-control none --profile-from-start off --target-processes all \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section LaunchStats --section Occupancy \
    --export "$OUT/ncu" --force-overwrite \
    python3 deepgemm/scripts/profile_gemm.py --shapes "$SHAPES"
  echo "ncu rc=$?"
  # --export keeps the details out of the console: print them from the report
  ncu --import "$OUT/ncu.ncu-rep" --page details --print-units base
} > "$OUT/ncu.log" 2>&1
tail -150 "$OUT/ncu.log"
