// MLA decode, sm_90a, the wgmma variant (FLASHMLA_KERNEL=wgmma; BF16 cache): warp-specialised
// TMA + wgmma main kernel. Same split-KV metadata, partial buffers and combine kernel as the
// default kernel in mla_decode.cu (launch_mla_decode runs the combine after this one).
//
// One CTA = 64 query rows (row = i*h_q + h of one request; rows past s_q*h_q are padding) x one
// scheduler part, 384 threads in three warpgroups:
//   WG0  producer: one thread issues TMA loads (cp.async.bulk.tensor, 128B swizzle) of the Q tile
//        (64 x 576, once per request) and of the K pages (64 tokens x 576) into a 2-stage ring,
//        with full/empty mbarriers. setmaxnreg.dec to 24 registers.
//   WG1  consumer 0: S = Q K^T (wgmma m64n64k16 x 36, both operands from shared memory), mask,
//        online softmax in registers (exp2 domain), P -> shared memory as two bf16 planes
//        hi = bf16(p), lo = bf16(p - hi), then O[:, 0:W1] += P V (wgmma m64n128k16 / n256k16).
//   WG2  consumer 1: O[:, W1:512] += P V from the same P (its S work is done by WG1), so WG2's
//        P V of page t overlaps WG1's S and softmax of page t+1. setmaxnreg.inc to 240 for both.
//        W1 = FLASHMLA_WGMMA_SPLIT (128 by default: WG1's S + softmax are the critical path, so
//        WG2 takes 3/4 of P V, 192 accumulator registers; 256 splits P V evenly).
// P hi/lo: bf16 P alone misses the 8e-4 absolute tolerance of the tests in 46 of 96 sweep cases
// (CPU emulation of this kernel's rounding, see BENCHMARKS.md), all of them requests of few keys:
// the error of bf16 P shrinks with the number of keys that share the softmax mass. So requests of
// fewer than a.p_bf16_min_keys keys (1024 by default) send P as two planes, hi = bf16(p) and
// lo = bf16(p - hi) (~2^-16 of fp32 P; P V runs twice), longer ones as bf16 P, as the original does.
// Shared memory (226 KiB): Q 72 KiB + 2 x 72 KiB K stages + 8 KiB P_lo. P_hi of page t goes into
// the RoPE slab (columns 512..575) of page t's stage, which only S reads.
// V = the first 512 columns of the page, read by wgmma as an MN-major (transposed) B operand.
// Cache rows past a request's length may hold anything (NaN in the tests): S masks them with a
// select, and WG1 zeroes them in the V slabs of the last page before any P V reads them.
#include "wgmma_common.cuh"

namespace flashmla {
namespace {

template <int W1>
__global__ void __launch_bounds__(NTHREADS, 1)
    mla_decode_wgmma_kernel(const __grid_constant__ DecodeArgs a, const __grid_constant__ CUtensorMap tmK,
                            const __grid_constant__ CUtensorMap tmQ) {
  extern __shared__ __align__(16) uint8_t smem_raw[];  // aligned to 1024 in begin_cta
  CtaPart c;
  if (!begin_cta(a, smem_raw, 1, c)) return;  // full[s]: the producer's expect_tx + TMA bytes
  const uint32_t uQ = c.uQ, uK = c.uK, uBar = c.uBar, bar_qfull = c.bar_qfull, bar_qempty = c.bar_qempty;
  const int wg = c.wg, t = c.t, m = c.m, row_base = c.row_base;
  const int b0 = c.b0, k0 = c.k0, b1 = c.b1, k1 = c.k1, first = c.first, last = c.last;

  if (wg == 0) {
    // ------------------------------------------------------------------ producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (t != 0) return;
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmK)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmQ)) : "memory");
    int it = 0, qn = 0;
    // one row tile (<= 64 rows): no other CTA reads the pages, so they may leave the L2 first (l2_policy_evict_first); with more,
    // the default policy (a cache hint of evict_normal measured 0.93-0.98x at 128 rows, session 39)
    const bool one_tile = gridDim.x == 1;
    const uint64_t pol = l2_policy_evict_first();
    for (int b = b0; b <= last && b < a.batch; ++b) {
      const Work w = request_work(a, b, b0, k0, b1, k1, first);
      if (w.split && w.g >= a.batch + a.parts) break;
      if (w.kbeg >= w.kend) continue;
      mbar_wait(bar_qempty, (qn & 1) ^ 1);  // WG1 is done with the previous request's Q
      mbar_expect_tx(bar_qfull, TILE);
      for (int j = 0; j < NSLAB; ++j) tma_load_2d(uQ + j * SLAB, &tmQ, j * 64, b * m + row_base, bar_qfull);
      ++qn;
      const int* bt = a.block_table + (int64_t)b * a.bt_stride;
      const __nv_bfloat16* kc = static_cast<const __nv_bfloat16*>(a.kcache);
      // while it waits for a free stage, the producer has the pages up to pf ahead of its TMA load
      // prefetched into L2 (with two stages only one page is in flight from HBM otherwise); too deep
      // and 132 CTAs' prefetches outgrow the L2
      const int pf = a.l2_prefetch_pages;
      for (int p = w.kbeg + 1; p < min(w.kbeg + pf, w.kend); ++p) prefetch_l2_bulk(kc + (int64_t)bt[p] * PAGE * D_QK, TILE);
      for (int blk = w.kbeg; blk < w.kend; ++blk, ++it) {
        const int s = it & 1;
        if (pf > 0 && blk + pf < w.kend) prefetch_l2_bulk(kc + (int64_t)bt[blk + pf] * PAGE * D_QK, TILE);
        mbar_wait(uBar + 16 + 8 * s, ((it >> 1) & 1) ^ 1);
        mbar_expect_tx(uBar + 8 * s, TILE);
        const int row = bt[blk] * PAGE;
        for (int j = 0; j < NSLAB; ++j) {
          if (one_tile) tma_load_2d_hint(uK + s * TILE + j * SLAB, &tmK, j * 64, row, uBar + 8 * s, pol);
          else tma_load_2d(uK + s * TILE + j * SLAB, &tmK, j * 64, row, uBar + 8 * s);
        }
      }
    }
    return;
  }

  // -------------------------------------------------------------------- consumers
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  run_consumers<true, W1>(a, c);
}

}  // namespace

int launch_mla_decode_wgmma(const DecodeArgs& a, void* stream) {
  // the TMA maps treat the cache and q as rows of 576 bf16: pages must be back to back and the
  // base pointers 16-byte aligned; otherwise -1 (the default kernel runs instead)
  if (a.is_fp8 || a.kcache_block_stride != (int64_t)PAGE * D_QK ||
      (reinterpret_cast<uintptr_t>(a.kcache) | reinterpret_cast<uintptr_t>(a.q)) % 16 != 0)
    return -1;
  alignas(64) CUtensorMap tmK, tmQ;
  const int m = a.s_q * a.h_q;
  if (!make_map(&tmK, a.kcache, D_QK, D_QK * 2, static_cast<uint64_t>(a.num_blocks) * PAGE) ||
      !make_map(&tmQ, a.q, D_QK, D_QK * 2, static_cast<uint64_t>(a.batch) * m))
    return -1;
  auto kernel = a.wg1_cols == 128 ? mla_decode_wgmma_kernel<128> : mla_decode_wgmma_kernel<256>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  if (e != cudaSuccess) return e;
  kernel<<<dim3((m + BM - 1) / BM, a.parts), NTHREADS, SMEM, static_cast<cudaStream_t>(stream)>>>(a, tmK, tmQ);
  return cudaGetLastError();
}

}  // namespace flashmla
