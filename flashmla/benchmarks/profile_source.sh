#!/usr/bin/env bash
# Nsight Compute source view of one decode kernel on one case, one device call (from the repository root):
#     bash flashmla/benchmarks/profile_source.sh OUTDIR CASE KERNEL_REGEX [ncu_source_summary.py args]
# e.g. `... $OUT bf16:64:16384:128 wgmma_kernel --role softmax=MUFU.EX2`. Builds flashmla, profiles CASE
# (profile_decode.py --cases) with the SourceCounters and WarpStateStats sections, and writes OUTDIR/src.csv.gz
# (per-SASS-instruction samples and stall reasons), OUTDIR/details.txt and OUTDIR/summary.txt
# (ncu_source_summary.py). Clocks as found.
set -uo pipefail
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"; CASE=$2; KREGEX=$3; shift 3
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
python3 -m pip install -q --no-build-isolation --no-deps ./flashmla 2>&1 | tail -3
timeout 300 ncu --clock-control none --profile-from-start off --kernel-name "regex:$KREGEX" \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source no \
  --export /tmp/src_rep --force-overwrite python3 flashmla/benchmarks/profile_decode.py --cases "$CASE" \
  > "$OUT/ncu_run.log" 2>&1
echo "ncu rc=$? ($(tail -1 "$OUT/ncu_run.log"))"
ncu --import /tmp/src_rep.ncu-rep --page details --print-units base > "$OUT/details.txt" 2>&1
ncu --import /tmp/src_rep.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>/dev/null
gzip -c /tmp/src.csv > "$OUT/src.csv.gz"
python3 flashmla/benchmarks/ncu_source_summary.py /tmp/src.csv "$@" | tee "$OUT/summary.txt"
