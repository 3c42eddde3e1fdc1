#!/usr/bin/env bash
# compute-sanitizer over deepgemm's JIT kernels (installed), one device call (from the repository root):
#   bash deepgemm/scripts/sanitize.sh OUTDIR [TOOL...]   (default: memcheck racecheck synccheck initcheck)
# memcheck: dense FP8 and BF16 at unaligned M, FP8 and FP32 output with C, grouped contiguous
# and masked (empty groups; TMA-store epilogue), swap-AB, split-K, 128 x 192 and 128 x 256 tiles, the small-M kernel (every K-slice count),
# both epilogues at 132 and 77 SMs, with PyTorch's caching allocator off; then, with it on (graph capture
# needs it), the tests that replay graphs: multicast, TMA store, split-K with multicast and pipelining, the
# small-M kernel, the tail peel (two launches); A's scales once per CTA (SFA_ONCE=1, split-K slices included). racecheck and synccheck: one case of each kernel family (the unsplit K split with PIPE: 37 x 4096), and initcheck (every kernel
# instrumented, PyTorch's too) the same. See ci/sanitize.
OUT=$1; shift; TOOLS=${*:-memcheck racecheck synccheck initcheck}
WIDE="(fp8_gemm_nt and (37-n or 1000-n)) or m_grouped_masked or (m_grouped_contiguous and nk1) \
or swap_ab_masked or (swap_ab_dense and 5-) or split_k_edges or bn256_wide or accumulate or bf16_gemm \
or epilogues_and_block_sizes or pipelined_fp8 or gemv_edges or tma_store_grouped or bn192_tiles or sfa_once_edges"
GRAPHS="multicast_dense or tma_store_epilogue or split_k_multicast or split_k_pipe or cuda_graph_masked \
or gemv_deterministic or (peel_tail and 4000)"
NARROW="(fp8_gemm_nt and (37-n2112 or 37-n4096)) or (m_grouped_masked and 4-128-nk1-True) or (split_k_edges and 64-2120) \
or (bn256_wide_tiles and 2-staged) or (swap_ab_dense and n1000k512-5-1) or (m_grouped_contiguous and 8-256-nk1-True) \
or (gemv_edges and 16-2120) or (tma_store_grouped and 1-True) or (bn192_tiles and direct) or (sfa_once_edges and 37-1000)"
rc=0
for t in $TOOLS; do
  case $t in
    memcheck)
      ci/sanitize "$OUT" deepgemm "$t" deepgemm "$WIDE" "${SANITIZE_SECONDS:-150}" || rc=1
      SANITIZE_CACHING=1 ci/sanitize "$OUT" deepgemm "$t" deepgemm "$GRAPHS" "${SANITIZE_SECONDS:-150}" || rc=1 ;;
    *) ci/sanitize "$OUT" deepgemm "$t" deepgemm "$NARROW" "${SANITIZE_SECONDS:-150}" || rc=1 ;;
  esac
done
exit $rc
