#!/usr/bin/env bash
# Where racecheck's hazards in the BF16 wgmma kernel come from (session 27: reported on the alpha and 1/l slots
# in test_odd_heads_mtp_and_short_requests[*-33-3-True] only), one device call from the repository root:
#   bash flashmla/benchmarks/racecheck_study.sh OUTDIR
# 1. racecheck_pattern.cu, modes 0-6 (the kernel's ordering in isolation, a TMA tensor copy included; mode 3 is a
#    real race, the positive control); 2. single decode calls (decode_case.py) under FLASHMLA_KERNEL=wgmma over
#    h_q x s_q x causal, so that the shape that triggers the reports can be named. Writes OUTDIR/racecheck_study.log.
OUT=$1; mkdir -p "$OUT"; log=$OUT/racecheck_study.log
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo -I flashmla/csrc -o /tmp/rcp flashmla/benchmarks/racecheck_pattern.cu
for m in 0 1 2 4 5 6 3; do
  timeout 30 compute-sanitizer --tool racecheck --print-limit 2 /tmp/rcp $m 2>&1 | grep -E "mode|Race reported|SUMMARY" | cut -c1-160
done | tee "$log"
python3 -m pip install -q --no-build-isolation --no-deps ./flashmla > "$OUT/build.log" 2>&1 || tail -20 "$OUT/build.log"
for c in "33 3 --causal" "33 3" "33 1" "64 1" "64 2 --causal" "100 1" "128 1" "128 4 --causal" "7 2"; do
  set -- $c
  FLASHMLA_KERNEL=wgmma timeout 60 compute-sanitizer --tool racecheck --kernel-name kns=mla --print-limit 4 \
    python3 flashmla/benchmarks/decode_case.py --h-q $1 --s-q $2 $3 2>&1 \
    | grep -E "^h_q|Race reported|SUMMARY" | sed -E 's/flashmla::<unnamed>::run_consumers<([^>]*)>.*(wgmma_common.cuh:[0-9]+).*/run_consumers<\1> \2/' \
    | cut -c1-160
done | tee -a "$log"
