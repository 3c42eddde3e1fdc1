#!/usr/bin/env bash
# Nsight Compute throughput sections of one decode case under several environments, one device call:
#     bash flashmla/benchmarks/profile_sol.sh OUTDIR CASE KERNEL_REGEX "NAME [VAR=VALUE ...]" ...
# e.g. `... $OUT bf16:64:16384:128 wgmma_kernel default "seesaw FLASHMLA_KERNEL=wgmma FLASHMLA_WGMMA_SEESAW=1"`
# (session 19). Builds flashmla, then for each variant profiles CASE (profile_decode.py --cases, checked against
# the reference first) with SpeedOfLight, ComputeWorkloadAnalysis (the tensor pipe's share of cycles) and
# MemoryWorkloadAnalysis, plus the shared-memory wavefront count, into OUTDIR/NAME.txt. Clocks as found.
set -uo pipefail
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"; CASE=$2; KREGEX=$3; shift 3
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
python3 -m pip install -q --no-build-isolation --no-deps ./flashmla 2>&1 | tail -3
for variant in "$@"; do
  read -r name envs <<<"$variant"
  env $envs timeout 200 ncu --clock-control none --profile-from-start off --kernel-name "regex:$KREGEX" \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --metrics l1tex__data_pipe_lsu_wavefronts_mem_shared.sum --print-units base \
    python3 flashmla/benchmarks/profile_decode.py --cases "$CASE" >"$OUT/$name.txt" 2>&1
  echo "$name: rc=$?"; grep -E "Duration|SM Busy|Issue Slots|wavefronts_mem_shared|L1/TEX Cache" "$OUT/$name.txt"
done
