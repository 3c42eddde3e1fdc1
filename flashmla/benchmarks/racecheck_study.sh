#!/usr/bin/env bash
# Where racecheck's hazards in the BF16 wgmma kernel come from (session 27: reported on the alpha and 1/l slots
# in test_odd_heads_mtp_and_short_requests[*-33-3-True] only), one device call from the repository root:
#   bash flashmla/benchmarks/racecheck_study.sh OUTDIR
# 1. racecheck_pattern.cu, modes 0-6 (the kernel's ordering in isolation, a TMA tensor copy included; mode 3 is a
#    real race, the positive control); 2. single decode calls (decode_case.py) under FLASHMLA_KERNEL=wgmma, shapes
#    chosen by the pages and requests each CTA gets, so that what triggers the reports can be named.
#    Writes OUTDIR/racecheck_study.log.
OUT=$1; mkdir -p "$OUT"; log=$OUT/racecheck_study.log
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo -I flashmla/csrc -o /tmp/rcp flashmla/benchmarks/racecheck_pattern.cu
for m in 0 1 2 4 5 6 3; do
  timeout 30 compute-sanitizer --tool racecheck --print-limit 2 /tmp/rcp $m 2>&1 | grep -E "mode|Race reported|SUMMARY" | cut -c1-160
done | tee "$log"
python3 -m pip install -q --no-build-isolation --no-deps ./flashmla > "$OUT/build.log" 2>&1 || tail -20 "$OUT/build.log"
# the test's lengths (10 requests: at 14 rows one page per CTA, at 99 rows up to two), then, at 64 rows, CTAs of
# exactly 1, 2 and 3 pages of one request (132 x 64, 128, 192 keys), 2 requests of 2 pages (264 x 128), 4 of one
# page (400 x 64), 8 pages of one (32 x 2048), the latter two-tile causal and FP8 too
for c in "33 3 --causal" "33 3" "7 2" "64 1 --lens 132x64" "64 1 --lens 132x128" "64 1 --lens 132x192" \
         "64 1 --lens 264x128" "64 1 --lens 400x64" "64 1 --lens 32x2048" "33 3 --causal --lens 32x2048" \
         "64 1 --fp8 --lens 32x2048"; do
  set -- $c
  FLASHMLA_KERNEL=wgmma timeout 60 compute-sanitizer --tool racecheck --kernel-name kns=mla --print-limit 4 \
    python3 flashmla/benchmarks/decode_case.py --h-q $1 --s-q $2 "${@:3}" 2>&1 \
    | grep -E "^h_q|Race reported|SUMMARY" | sed -E 's/flashmla::<unnamed>::run_consumers<([^>]*)>.*(wgmma_common.cuh:[0-9]+).*/run_consumers<\1> \2/' \
    | cut -c1-160
done | tee -a "$log"
