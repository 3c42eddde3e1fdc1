// MLA decode, sm_90a, the wgmma variant for the FP8 cache (FLASHMLA_KERNEL=wgmma with
// is_fp8_kvcache): the BF16 wgmma kernel's consumers (wgmma_common.cuh: S, online softmax, P V,
// epilogue) behind a producer warpgroup that dequantises. Same metadata, partials and combine.
//
// FP8 token (656 bytes, quant.py): 512 e4m3 NoPE values | 4 fp32 scales (one per 128 columns) |
// 64 bf16 RoPE values. Per page of 64 tokens (41984 bytes):
//   WG0 (producer, 128 threads, setmaxnreg.dec to PRODUCER_REGS):
//     thread 0: TMA of the Q tile (once per request) and of the page's RoPE columns, which are
//       bf16 already, straight into slab 8 of the page stage (tensor map over rows of 328 bf16 =
//       656 bytes, box at column 264, 128B swizzle), so S reads them like the BF16 kernel does;
//       plus cp.async.bulk.prefetch.L2 of the raw page PF pages ahead.
//     all 128 threads: the NoPE bytes and scales with 16-byte ld.global (hits L2 after the
//       prefetch), e4m3 -> f16 (exact) -> f32, times the tile's fp32 scale, rounded once to bf16
//       (as the default kernel and dequantize_kvcache do), stored 128B-swizzled into slabs 0..7
//       of the stage. Token rows past the request's length are written as zeros (never loaded).
//       Each thread handles one 16-byte chunk of 16 tokens (r0 + 4i), in batches of 4 with two
//       batches in flight (the first two are loaded before waiting for the stage to be free).
//     full[s] completes on 129 arrivals (thread 0's expect_tx + all 128 after their stores and a
//       proxy fence) plus the 8 KiB of RoPE bytes; empty[s] as in the BF16 kernel (256 consumer
//       threads after their P V).
//   WG1, WG2: unchanged consumers (run_consumers<false>: no tail zeroing, the producer did it).
// Why no TMA ring of raw FP8 pages: Q (72 KiB) + two bf16 page stages (2 x 72 KiB) + P_lo (8 KiB)
// leave ~5 KiB of the 227 KiB, and one raw page is 41 KiB; one bf16 stage instead would serialise
// the dequantisation of page t+1 behind the P V of page t. Registers instead of a raw ring:
// loads in flight per SM = 128 threads x 2 batches x 4 x 16 B = 16 KiB.
// Shared memory (same layout as the BF16 kernel, 231,232 bytes with the 1 KiB alignment slack):
//   [0, 72 KiB) Q | 2 x 72 KiB stages (slabs 0-7 dequantised NoPE = V, slab 8 RoPE, then P_hi)
//   | 8 KiB P_lo | 64 B mbarriers | 768 B row scales, 1/l.
#include "wgmma_common.cuh"

#include <cuda_fp8.h>

namespace flashmla {
namespace {

constexpr int FP8_TOKEN = 656, FP8_PAGE = PAGE * FP8_TOKEN;  // bytes per token / per page
constexpr int ROPE_COL = (D_V + 16) / 2;                       // RoPE start in bf16 units of a token row (264)
constexpr int PF = 4;                                          // L2 prefetch distance in pages
// register split: the launch gives 168 per thread (65536 / 384, 1 CTA/SM); what the producer
// releases (128 x (168 - P)) must cover what the consumers take (256 x (C - 168))
constexpr int PRODUCER_REGS = 104, CONSUMER_REGS = 200;
static_assert(128 * (168 - PRODUCER_REGS) >= 256 * (CONSUMER_REGS - 168), "setmaxnreg pool overdrawn");

__device__ __forceinline__ uint4 ld_nc16(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ float ld_nc_f32(const uint8_t* p) {
  float v;
  asm volatile("ld.global.nc.L1::no_allocate.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}
// two e4m3 (16 bits) -> two bf16 of value * sc, scaled in fp32 (e4m3 -> f16 is exact)
__device__ __forceinline__ uint32_t dq2(uint32_t two, float sc) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return pack_bf16(f.x * sc, f.y * sc);
}

__global__ void __launch_bounds__(NTHREADS, 1)
    mla_decode_wgmma_fp8_kernel(const __grid_constant__ DecodeArgs a, const __grid_constant__ CUtensorMap tmR,
                                const __grid_constant__ CUtensorMap tmQ) {
  extern __shared__ __align__(16) uint8_t smem_raw[];  // aligned to 1024 in begin_cta
  CtaPart c;
  if (!begin_cta(a, smem_raw, 1 + 128, c)) return;  // full[s]: thread 0's expect_tx + 128 dequant threads + RoPE bytes
  const uint32_t uQ = c.uQ, uK = c.uK, uBar = c.uBar, bar_qfull = c.bar_qfull, bar_qempty = c.bar_qempty;
  const int wg = c.wg, t = c.t, m = c.m, row_base = c.row_base;
  const int b0 = c.b0, k0 = c.k0, b1 = c.b1, k1 = c.k1, first = c.first, last = c.last;

  if (wg == 0) {
    // ------------------------------------------------------------ producer: TMA + dequantise
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS) : "memory");
    if (t == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmR)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmQ)) : "memory");
    }
    const uint8_t* kc8 = static_cast<const uint8_t*>(a.kcache);
    // Thread -> (token, 16-byte chunk): warp w takes tokens 2(w/2) + {0, 1} (+ 4i, i = 0..15) and the
    // chunks 16(w%2) .. +15; a quarter warp = chunks 4q..4q+3 of two adjacent tokens, whose 128B
    // swizzle (unit ^= row & 7) sends them to the 8 distinct 16-byte units of a row: no bank conflict.
    const int lane = t & 31, w4 = t >> 5;
    const int r0 = 2 * (w4 >> 1) + ((lane >> 2) & 1);              // first token; then r0 + 4i
    const int cc = 16 * (w4 & 1) + (lane >> 3) * 4 + (lane & 3);    // columns 16cc .. 16cc + 15
    const int unit = (cc & 3) * 2;                                   // its first 16-byte unit in the slab row
    // swizzled unit offsets of the two stores (columns 16cc.. and 16cc+8..), for even and odd i
    // (row & 7 = r0 + 4 (i & 1))
    const uint32_t sw[2][2] = {{((unit ^ r0) & 7u) << 4, (((unit + 1) ^ r0) & 7u) << 4},
                               {((unit ^ (r0 + 4)) & 7u) << 4, (((unit + 1) ^ (r0 + 4)) & 7u) << 4}};
    int it = 0, qn = 0;
    for (int b = b0; b <= last && b < a.batch; ++b) {
      const Work w = request_work(a, b, b0, k0, b1, k1, first);
      if (w.split && w.g >= a.batch + a.parts) break;
      if (w.kbeg >= w.kend) continue;
      const int* bt = a.block_table + (int64_t)b * a.bt_stride;
      if (t == 0) {
        mbar_wait(bar_qempty, (qn & 1) ^ 1);  // WG1 is done with the previous request's Q
        mbar_expect_tx(bar_qfull, TILE);
        for (int j = 0; j < NSLAB; ++j) tma_load_2d(uQ + j * SLAB, &tmQ, j * 64, b * m + row_base, bar_qfull);
        for (int p = w.kbeg; p < min(w.kbeg + PF, w.kend); ++p)
          prefetch_l2_bulk(kc8 + (int64_t)bt[p] * a.kcache_block_stride, FP8_PAGE);
      }
      ++qn;
      for (int blk = w.kbeg; blk < w.kend; ++blk, ++it) {
        const int s = it & 1;
        const int valid = w.L - blk * PAGE;     // tokens of this page inside the request (>= 1)
        const uint8_t* src = kc8 + (int64_t)bt[blk] * a.kcache_block_stride + cc * 16;
        const uint8_t* ssrc = kc8 + (int64_t)bt[blk] * a.kcache_block_stride + D_V + (cc >> 3) * 4;
        if (t == 0 && blk + PF < w.kend) prefetch_l2_bulk(kc8 + (int64_t)bt[blk + PF] * a.kcache_block_stride, FP8_PAGE);
        const uint32_t rows = uK + s * TILE + (cc >> 2) * SLAB + r0 * 128;  // slab of chunk cc, row r0
        // two batches of 4 tokens in registers: batch k+1 loads while batch k converts and stores
        uint4 va[4], vb[4];
        float sa[4], sb[4];
        auto load = [&](int i0, uint4 (&v)[4], float (&sc)[4]) {  // tokens r0 + 4 (i0 + i); a token
          // past the length (inside the page, so readable, but arbitrary: NaN in the tests) becomes
          // fp8 0 with scale 0
          const uint8_t* p = src + (r0 + 4 * i0) * FP8_TOKEN;
          const uint8_t* ps = ssrc + (r0 + 4 * i0) * FP8_TOKEN;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const bool ok = r0 + 4 * (i0 + i) < valid;
            const uint4 x = ld_nc16(p + i * 4 * FP8_TOKEN);
            const float y = ld_nc_f32(ps + i * 4 * FP8_TOKEN);
            v[i] = ok ? x : make_uint4(0, 0, 0, 0);
            sc[i] = ok ? y : 0.f;
          }
        };
        auto store = [&](int i0, const uint4 (&v)[4], const float (&sc)[4]) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t row = rows + (i0 + i) * 4 * 128;
            st_shared_v4(row + sw[i & 1][0], dq2(v[i].x & 0xffffu, sc[i]), dq2(v[i].x >> 16, sc[i]),
                         dq2(v[i].y & 0xffffu, sc[i]), dq2(v[i].y >> 16, sc[i]));
            st_shared_v4(row + sw[i & 1][1], dq2(v[i].z & 0xffffu, sc[i]), dq2(v[i].z >> 16, sc[i]),
                         dq2(v[i].w & 0xffffu, sc[i]), dq2(v[i].w >> 16, sc[i]));
          }
        };
        load(0, va, sa);                                         // in flight while we wait
        load(4, vb, sb);
        mbar_wait(uBar + 16 + 8 * s, ((it >> 1) & 1) ^ 1);      // both consumers done with page it-2
        if (t == 0) {
          mbar_expect_tx(uBar + 8 * s, SLAB);
          tma_load_2d(uK + s * TILE + 8 * SLAB, &tmR, ROPE_COL, bt[blk] * PAGE, uBar + 8 * s);
        }
        store(0, va, sa);
        load(8, va, sa);
        store(4, vb, sb);
        load(12, vb, sb);
        store(8, va, sa);
        store(12, vb, sb);
        fence_async_smem();   // generic-proxy stores -> visible to wgmma (async proxy)
        mbar_arrive(uBar + 8 * s);
      }
    }
    return;
  }

  // -------------------------------------------------------------------- consumers
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS) : "memory");
  run_consumers<false, 256>(a, c);
}

}  // namespace

int launch_mla_decode_wgmma_fp8(const DecodeArgs& a, void* stream) {
  // TMA maps: the FP8 cache as rows of 656 bytes (pages back to back), q as rows of 576 bf16;
  // base pointers 16-byte aligned. Otherwise -1 (the default kernel runs instead).
  if (!a.is_fp8 || a.kcache_block_stride != (int64_t)FP8_PAGE ||
      (reinterpret_cast<uintptr_t>(a.kcache) | reinterpret_cast<uintptr_t>(a.q)) % 16 != 0)
    return -1;
  alignas(64) CUtensorMap tmR, tmQ;
  const int m = a.s_q * a.h_q;
  if (!make_map(&tmR, a.kcache, FP8_TOKEN / 2, FP8_TOKEN, static_cast<uint64_t>(a.num_blocks) * PAGE) ||
      !make_map(&tmQ, a.q, D_QK, D_QK * 2, static_cast<uint64_t>(a.batch) * m))
    return -1;
  cudaError_t e =
      cudaFuncSetAttribute(mla_decode_wgmma_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  if (e != cudaSuccess) return e;
  dim3 grid((m + BM - 1) / BM, a.parts);
  mla_decode_wgmma_fp8_kernel<<<grid, NTHREADS, SMEM, static_cast<cudaStream_t>(stream)>>>(a, tmR, tmQ);
  return cudaGetLastError();
}

}  // namespace flashmla
