#!/usr/bin/env bash
# compute-sanitizer over flashmla's kernels (installed), one device call (from the repository root):
#   bash flashmla/benchmarks/sanitize.sh OUTDIR [TOOL...]   (default: memcheck racecheck synccheck initcheck)
# memcheck takes the wider selection (every kernel: default, BF16 and FP8 wgmma, swap-AB BF16,
# FP8 bf16-stage and register-fed at 16 and 32 rows (and its FLASHMLA_FP8_PV=1 path), the f16 consumers, the combine, the metadata kernel;
# ragged lengths with 0, 1, 63, 65 keys, s_q up to 5, causal; PyTorch's caching allocator off), then, with it
# on (graph capture needs it), the CUDA-graph replay tests; racecheck and synccheck, slower, one case
# of each kernel, and initcheck (every kernel instrumented, PyTorch's too) the same. See ci/sanitize.
OUT=$1; shift; TOOLS=${*:-memcheck racecheck synccheck initcheck}
WIDE="odd_heads or (fp8_swapab_rf_data and randn) or fp8_wgmma_matches or fp8_swapab_matches \
or wgmma_matches_default or (metadata_matches and None) or poisoned_output or (fp8_f16_consumers and randn) \
or fp8_swapab_deterministic or (fp8_pv_exact and (0-1-16-1 or default-0-3-5)) or (fp8_pv_accuracy and randn)"
NARROW="(odd_heads and (33-3-True or 7-2-False)) or (fp8_swapab_matches and (16-1 or 32-1 or 8-2)) \
or (fp8_wgmma_matches and 16-1) or (fp8_f16_consumers and randn-64-1) or (metadata_matches and 16-lens1-None) \
or (fp8_swapab_rf_data and (randn-16-1 or randn-32-1)) or (fp8_pv_exact and (0-0-16-1 or 0-1-8-2))"
GRAPHS="cuda_graph_replay or fp8_wgmma_cuda_graph or fp8_swapab_cuda_graph"
rc=0
for t in $TOOLS; do
  case $t in memcheck) k=$WIDE ;; *) k=$NARROW ;; esac
  ci/sanitize "$OUT" flashmla "$t" mla "$k" "${SANITIZE_SECONDS:-150}" || rc=1
  [ "$t" = memcheck ] && { SANITIZE_CACHING=1 ci/sanitize "$OUT" flashmla "$t" mla "$GRAPHS" "${SANITIZE_SECONDS:-150}" || rc=1; }
done
exit $rc
