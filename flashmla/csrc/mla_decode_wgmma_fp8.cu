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
//     all 128 threads, before the stage is free: their 16 scales and their 8 chunks of the first 256 NoPE
//       bytes of the page's tokens (box 0) with ld.global into registers (L2 after the prefetch), so
//       that those loads are in flight while the consumers still hold the stage.
//     thread 0, once the stage is free (empty[s]): TMA of the other 256 NoPE bytes per token (box 1) as
//       an unswizzled box of 256 bytes x 64 tokens (16 KiB, tensor map of uint8 over the same 656-byte
//       rows) into the stage itself, slabs RAW1_SLAB = 6-7, raw_full[s] completing on its expect_tx
//       + the 16 KiB.
//     all 128 threads, per 16-byte raw chunk: e4m3 -> f16 (exact) -> f32, times the tile's fp32 scale,
//       rounded once to bf16 (as the default kernel and dequantize_kvcache do), stored 128B-swizzled
//       into slabs 0..7: box 0 from registers into slabs 0-3 while box 1 arrives, then box 1 (slabs
//       6-7) into slabs 4-7, over its own raw bytes, so every thread first reads all its box-1 chunks
//       into registers and the warpgroup syncs (named barrier BAR_PRODUCER) before any of those stores.
//       Token rows past the request's length are written as zeros.
//       Thread -> (chunk cb of a box, tokens r0 + 8i, i = 0..7), see the kernel.
//     full[s] completes on 129 arrivals (thread 0's expect_tx + all 128 after their stores and a
//       proxy fence) plus the 8 KiB of RoPE bytes; empty[s] as in the BF16 kernel (256 consumer
//       threads after their P V).
//   WG1, WG2: unchanged consumers (run_consumers<false>: no tail zeroing, the producer did it).
// Why the raw bytes land in the stage: Q (72 KiB) + two bf16 page stages (2 x 72 KiB) + P_lo (8 KiB)
// leave under 1 KiB of the 227 KiB, so there is no room for a ring of raw pages; the stage's own
// slabs 6-7 hold box 1's 16 KiB of raw NoPE until they are dequantised over. (History, H200: every raw byte
// by 16-byte ld.global after the stage was free, 16 KiB in flight per SM: 0.51-0.78x the BF16 cache; both
// boxes by TMA: 0.76-0.83x; box 0 by ld.global before the stage is free: +2-5 %, session 17.)
// Shared memory (same layout as the BF16 kernel, 231,488 bytes with the 1 KiB alignment slack):
//   [0, 72 KiB) Q | 2 x 72 KiB stages (slabs 0-7 dequantised NoPE = V, slab 8 RoPE, then P_hi)
//   | 8 KiB P_lo | 64 B mbarriers (raw_full[2] at 48, 56) | 1 KiB row scales, 1/l.
#include "wgmma_common.cuh"

#include <cuda_fp8.h>
#include <type_traits>

namespace flashmla {
namespace {

constexpr int FP8_TOKEN = 656, FP8_PAGE = PAGE * FP8_TOKEN;  // bytes per token / per page
constexpr int ROPE_COL = (D_V + 16) / 2;                       // RoPE start in bf16 units of a token row (264)
constexpr int PF = 4;                                          // L2 prefetch distance in pages
// raw NoPE bytes of a page: two boxes of 256 columns x 64 tokens (16 KiB each); box 1 by TMA (unswizzled)
// into slabs RAW1_SLAB, RAW1_SLAB + 1 of the stage it is dequantised into
constexpr int RAW_BOX = 256 * PAGE, RAW1_SLAB = 6;
constexpr int BAR_PRODUCER = 7;     // named barrier of the producer warpgroup (consumers use 1-6)
// register split: the launch gives 168 per thread (65536 / 384, 1 CTA/SM); what the producer
// releases (128 x (168 - P)) must cover what the consumers take (256 x (C - 168))
constexpr int PRODUCER_REGS = 104, CONSUMER_REGS = 200;
static_assert(128 * (168 - PRODUCER_REGS) >= 256 * (CONSUMER_REGS - 168), "setmaxnreg pool overdrawn");

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint4 ld_nc_v4(const uint8_t* p) {
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
// f16 consumers (FLASHMLA_FP8_F16=1): two e4m3 -> two f16 of f16(value * s), s = f16(sc) where sc is a normal f16
// that cannot overflow 448 x sc (f16_safe), else sc itself. dq2_f16: one HMUL2 (the product of two f16 is exact
// before its rounding); dq2_f16_f32: the same value through fp32, for a page where the warp meets an unsafe scale
constexpr float F16_SCALE_MIN = 6.103515625e-05f, F16_SCALE_MAX = 65504.f / 448.f;
__device__ __forceinline__ bool f16_safe(float sc) { return sc >= F16_SCALE_MIN && sc <= F16_SCALE_MAX; }
__device__ __forceinline__ uint32_t dq2_f16(uint32_t two, __half2 s2) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&h), s2);
  return *reinterpret_cast<const uint32_t*>(&r);
}
__device__ __forceinline__ uint32_t dq2_f16_f32(uint32_t two, float s) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __half2 r = __floats2half2_rn(f.x * s, f.y * s);
  return *reinterpret_cast<const uint32_t*>(&r);
}

// f16 consumers: the Q tile (64 x 576 bf16 at uQ, landed on q_full) converted in place by the producer
// warpgroup: the NoPE slabs 0-7 to f16 and, when |Q| exceeds 2^15 anywhere in the tile, both parts scaled
// by 2^-E first (exact; WG1 multiplies S by 2^E, read from sQmul); then q_ready
__device__ __forceinline__ void convert_q(const CtaPart& c, int t, int parity) {
  mbar_wait(c.bar_qfull, parity);
  float mx = 0.f;
  for (int g = t; g < TILE / 16; g += 128) mx = absmax_bf16x8(ld_shared_v4(c.uQ + g * 16), mx);
  mx = warpgroup_max(mx, c.sQred, t, BAR_PRODUCER);
  const int e = mx > 32768.f ? static_cast<int>(fminf(ceilf(log2f(mx / 32768.f)), 126.f)) : 0;  // (inf: 126)
  const float down = exp2f(static_cast<float>(-e));
  for (int g = t; g < TILE / 16; g += 128) {
    const uint4 v = ld_shared_v4(c.uQ + g * 16);
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
    const bool nope = g * 16 < 8 * SLAB;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]));
      if (nope) {
        const __half2 h = __floats2half2_rn(f.x * down, f.y * down);
        w[k] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        w[k] = pack_bf16(f.x * down, f.y * down);
      }
    }
    st_shared_v4(c.uQ + g * 16, w[0], w[1], w[2], w[3]);
  }
  if (t == 0) *c.sQmul = exp2f(static_cast<float>(e));
  fence_async_smem();  // generic-proxy stores -> visible to wgmma
  mbar_arrive(c.bar_qready);
}

template <bool F16>
__global__ void __launch_bounds__(NTHREADS, 1)
    mla_decode_wgmma_fp8_kernel(const __grid_constant__ DecodeArgs a, const __grid_constant__ CUtensorMap tmR,
                                const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmN) {
  extern __shared__ __align__(16) uint8_t smem_raw[];  // aligned to 1024 in begin_cta
  CtaPart c;
  // full[s]: thread 0's expect_tx + 128 dequant threads + RoPE bytes; raw_full[s]: expect_tx + raw bytes
  if (!begin_cta(a, smem_raw, 1 + 128, c, true, F16)) return;
  const uint32_t uQ = c.uQ, uK = c.uK, uBar = c.uBar, bar_qfull = c.bar_qfull, bar_qempty = c.bar_qempty;
  const int wg = c.wg, t = c.t, m = c.m, row_base = c.row_base;
  const int b0 = c.b0, k0 = c.k0, b1 = c.b1, k1 = c.k1, first = c.first, last = c.last;

  if (wg == 0) {
    // ------------------------------------------------------------ producer: TMA + dequantise
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS) : "memory");
    if (t == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmR)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmQ)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tmN)) : "memory");
    }
    const uint8_t* kc8 = static_cast<const uint8_t*>(a.kcache);
    // Thread -> (16-byte chunk cb of a raw box, tokens r0 + 8i, i = 0..7): lanes 8q..8q+3 take chunks
    // 4q..4q+3 of token r0 (even), lanes 8q+4..8q+7 chunks 4q+4..4q+7 (mod 16) of token r0 + 1: each
    // quarter warp's 16-byte raw reads cover both 64-byte halves of the 128-byte bank window, and its
    // stores (output slabs cb / 4, 128B swizzle unit ^= row & 7, rows of opposite parity) 8 distinct
    // units: no bank conflict either way (the same chunks for both tokens had made the reads, 256 bytes
    // apart, meet 2-way). row & 7 = r0 & 7 for every i: the swizzle is per thread.
    const int lane = t & 31, w4 = t >> 5, half = (lane >> 2) & 1;
    const int r0 = 2 * w4 + half;
    const int cb = ((lane >> 3) * 4 + (lane & 3) + 4 * half) & 15;
    const int unit = (cb & 3) * 2;
    const uint32_t sw0 = ((unit ^ r0) & 7u) << 4, sw1 = (((unit + 1) ^ r0) & 7u) << 4;
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
      if constexpr (F16) convert_q(c, t, (qn - 1) & 1);
      // block-table entries are read one page ahead (page: this one, next_page: the next), so that a
      // page's loads do not wait on an L2 round trip for its index
      int page = bt[w.kbeg];
      for (int blk = w.kbeg; blk < w.kend; ++blk, ++it) {
        const int s = it & 1;
        const int valid = w.L - blk * PAGE;     // tokens of this page inside the request (>= 1)
        const uint32_t stage = uK + s * TILE, raw_full = uBar + OFF_RAW_FULL + 8 * s;
        const int next_page = blk + 1 < w.kend ? bt[blk + 1] : 0;
        const int pf_page = t == 0 && blk + PF < w.kend ? bt[blk + PF] : -1;
        // the scales of this thread's 16 (token, box) pairs, from global memory (L2 after the prefetch)
        // while the boxes arrive; a token past the length (readable, but arbitrary: NaN in the tests)
        // gets scale 0 and fp8 zeros below
        const uint8_t* ssrc = kc8 + (int64_t)page * a.kcache_block_stride + D_V + (cb >> 3) * 4;
        float sc[2][8];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int bx = 0; bx < 2; ++bx) sc[bx][i] = ld_nc_f32(ssrc + (r0 + 8 * i) * FP8_TOKEN + bx * 8);
        // box 0's raw chunks of this thread straight into registers, in flight while the stage is still busy
        // (box 1 too would take 32 more registers than the producer has: spills)
        uint4 v0[8];
        const uint8_t* src = kc8 + (int64_t)page * a.kcache_block_stride + cb * 16;
#pragma unroll
        for (int i = 0; i < 8; ++i) v0[i] = ld_nc_v4(src + (r0 + 8 * i) * FP8_TOKEN);
        mbar_wait(uBar + 16 + 8 * s, ((it >> 1) & 1) ^ 1);      // both consumers done with page it-2
        if (t == 0) {  // (page in a register: a block-table read here would be redone after each TMA)
          mbar_expect_tx(raw_full, RAW_BOX);
          tma_load_2d(stage + RAW1_SLAB * SLAB, &tmN, 256, page * PAGE, raw_full);
          mbar_expect_tx(uBar + 8 * s, SLAB);
          tma_load_2d(stage + 8 * SLAB, &tmR, ROPE_COL, page * PAGE, uBar + 8 * s);
        }
        fence_regs(sc[0]);  // the scale loads are waited for here, not before the waits above
        fence_regs(sc[1]);
        const uint4 zero = make_uint4(0, 0, 0, 0);
        // token row r of box 1: 256 raw bytes at RAW1_SLAB; chunk cb of box bx -> output slab 4 bx + cb / 4
        auto raw1 = [&](int i) {
          const uint4 x = ld_shared_v4(stage + RAW1_SLAB * SLAB + (r0 + 8 * i) * 256 + cb * 16);
          return r0 + 8 * i < valid ? x : zero;
        };
        // f16 consumers: one warp-uniform choice per page between HMUL2 and the fp32 fallback (a vote per
        // chunk would cut the straight-line conversion code into 16 branches)
        bool fast = true;
        if constexpr (F16) {
          bool ok = true;
#pragma unroll
          for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int bx = 0; bx < 2; ++bx) ok &= f16_safe(sc[bx][i]) || r0 + 8 * i >= valid;
          fast = __all_sync(0xffffffffu, ok);
        }
        auto put = [&](int bx, int i, uint4 v, auto fast_f16) {
          const float f = r0 + 8 * i < valid ? sc[bx][i] : 0.f;
          const uint32_t row = stage + (4 * bx + (cb >> 2)) * SLAB + (r0 + 8 * i) * 128;
          auto store = [&](auto cv) {  // cv: two e4m3 (low 16 bits) -> two converted values
            st_shared_v4(row + sw0, cv(v.x & 0xffffu), cv(v.x >> 16), cv(v.y & 0xffffu), cv(v.y >> 16));
            st_shared_v4(row + sw1, cv(v.z & 0xffffu), cv(v.z >> 16), cv(v.w & 0xffffu), cv(v.w >> 16));
          };
          if constexpr (!F16) {
            store([&](uint32_t two) { return dq2(two, f); });
          } else if constexpr (decltype(fast_f16)::value) {
            const __half2 f2 = __float2half2_rn(f);
            store([&](uint32_t two) { return dq2_f16(two, f2); });
          } else {
            const float se = f16_safe(f) ? __half2float(__float2half_rn(f)) : f;
            store([&](uint32_t two) { return dq2_f16_f32(two, se); });
          }
        };
        auto put_box = [&](int bx, auto chunk) {  // chunk(i): the raw 16 bytes of row group i
          if (!F16 || fast) {
#pragma unroll
            for (int i = 0; i < 8; ++i) put(bx, i, chunk(i), std::true_type{});
          } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) put(bx, i, chunk(i), std::false_type{});
          }
        };
        // box 0 (in registers) -> slabs 0-3 while box 1's TMA is in flight
        put_box(0, [&](int i) { return r0 + 8 * i < valid ? v0[i] : zero; });
        mbar_wait(raw_full, (it >> 1) & 1);
        // box 1 (raw in slabs 6-7) -> slabs 4-7, which hold the raw box: every producer thread reads all
        // of its box-1 chunks first, then the warpgroup syncs, then the stores
        uint4 v1[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v1[i] = raw1(i);
        bar_sync(BAR_PRODUCER, 128);
        put_box(1, [&](int i) { return v1[i]; });
        fence_async_smem();   // generic-proxy stores -> visible to wgmma (async proxy)
        mbar_arrive(uBar + 8 * s);
        // the L2 prefetch PF pages ahead goes out last: its block-table read has had the whole page to
        // arrive (issued at the top, it stalled warp 0 there, and so the warpgroup, for most of a page)
        if (pf_page >= 0) prefetch_l2_bulk(kc8 + (int64_t)pf_page * a.kcache_block_stride, FP8_PAGE);
        page = next_page;
      }
    }
    return;
  }

  // -------------------------------------------------------------------- consumers
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS) : "memory");
  run_consumers<false, 256, F16>(a, c);
}

}  // namespace

int launch_mla_decode_wgmma_fp8(const DecodeArgs& a, void* stream) {
  // TMA maps: the FP8 cache as rows of 656 bytes (pages back to back), q as rows of 576 bf16;
  // base pointers 16-byte aligned. Otherwise -1 (the default kernel runs instead).
  if (!a.is_fp8 || a.kcache_block_stride != (int64_t)FP8_PAGE ||
      (reinterpret_cast<uintptr_t>(a.kcache) | reinterpret_cast<uintptr_t>(a.q)) % 16 != 0)
    return -1;
  alignas(64) CUtensorMap tmR, tmQ, tmN;
  const int m = a.s_q * a.h_q;
  const uint64_t tokens = static_cast<uint64_t>(a.num_blocks) * PAGE;
  if (!make_map(&tmR, a.kcache, FP8_TOKEN / 2, FP8_TOKEN, tokens) ||
      !make_map(&tmQ, a.q, D_QK, D_QK * 2, static_cast<uint64_t>(a.batch) * m) ||
      !make_map(&tmN, a.kcache, D_V, FP8_TOKEN, tokens, CU_TENSOR_MAP_DATA_TYPE_UINT8, 256, CU_TENSOR_MAP_SWIZZLE_NONE))
    return -1;
  auto kernel = a.fp8_f16 ? mla_decode_wgmma_fp8_kernel<true> : mla_decode_wgmma_fp8_kernel<false>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  if (e != cudaSuccess) return e;
  dim3 grid((m + BM - 1) / BM, a.parts);
  kernel<<<grid, NTHREADS, SMEM, static_cast<cudaStream_t>(stream)>>>(a, tmR, tmQ, tmN);
  return cudaGetLastError();
}

}  // namespace flashmla
