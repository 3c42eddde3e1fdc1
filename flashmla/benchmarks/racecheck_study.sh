#!/usr/bin/env bash
# Where racecheck's hazards in the BF16 wgmma kernel come from (session 27: reported on the alpha and 1/l slots
# in test_odd_heads_mtp_and_short_requests[*-33-3-True] only), one device call from the repository root:
#   bash flashmla/benchmarks/racecheck_study.sh OUTDIR
# 1. racecheck_pattern.cu, modes 0-8 (the kernel's ordering in isolation, a TMA tensor copy included; mode 3 is a
#    real race, the positive control); 2. single decode calls (decode_case.py) under FLASHMLA_KERNEL=wgmma, shapes
#    chosen by the pages and requests each CTA gets, so that what triggers the reports can be named.
#    Writes OUTDIR/racecheck_study.log. STUDY_CASES="case|case|..." replaces the list of cases below;
#    STUDY_QUICK=1 skips the probe and the install (flashmla already installed).
OUT=$1; mkdir -p "$OUT"; log=$OUT/racecheck_study.log; : > "$log"
if [ "${STUDY_QUICK:-0}" != 1 ]; then
  nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo -I flashmla/csrc -o /tmp/rcp flashmla/benchmarks/racecheck_pattern.cu
  for m in 0 1 2 4 5 6 7 8 3; do
    timeout 30 compute-sanitizer --tool racecheck --print-limit 2 /tmp/rcp $m 2>&1 | grep -E "mode|Race reported|SUMMARY" | cut -c1-160
  done | tee -a "$log"
  python3 -m pip install -q --no-build-isolation --no-deps ./flashmla > "$OUT/build.log" 2>&1 || tail -20 "$OUT/build.log"
fi
# Session 27's cases, then what session 28's run of them pointed at: the hazards came with the hi/lo (short
# request) path and 2 or more pages in a CTA, never 1 page or long requests. FLASHMLA_P_BF16_MIN_KEYS moves a
# shape between the two paths. A case's first word is an environment assignment or "-".
cases=( "- 33 3 --causal" "- 7 2" "- 64 1 --lens 132x64" "- 64 1 --lens 132x128" "- 64 1 --lens 132x192" \
          "- 64 1 --lens 264x128" "- 64 1 --lens 400x64" "- 64 1 --lens 32x2048" "- 64 1 --fp8 --lens 32x2048" \
         "FLASHMLA_P_BF16_MIN_KEYS=0 64 1 --lens 132x128" "FLASHMLA_P_BF16_MIN_KEYS=0 33 3 --causal" \
         "FLASHMLA_P_BF16_MIN_KEYS=100000 64 1 --lens 32x2048" "FLASHMLA_WGMMA_SPLIT=256 64 1 --lens 132x128" \
         "FLASHMLA_P_BF16_MIN_KEYS=100000 64 1 --fp8 --lens 32x2048" "- 64 1 --fp8 --lens 132x128")
[ -n "${STUDY_CASES:-}" ] && IFS='|' read -r -a cases <<< "$STUDY_CASES"
for c in "${cases[@]}"; do
  set -- $c; e=$1; shift; [ "$e" = - ] && e=FLASHMLA_KERNEL=wgmma
  echo "## $e"
  env FLASHMLA_KERNEL=wgmma $e timeout 60 compute-sanitizer --tool racecheck --kernel-name kns=mla --print-limit 4 \
    python3 flashmla/benchmarks/decode_case.py --h-q $1 --s-q $2 "${@:3}" 2>&1 \
    | grep -E "^##|^h_q|Race reported|SUMMARY" | sed -E 's/flashmla::<unnamed>::run_consumers<([^>]*)>.*(wgmma_common.cuh:[0-9]+).*/run_consumers<\1> \2/' \
    | cut -c1-160
done | tee -a "$log"
