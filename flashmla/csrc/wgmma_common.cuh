// Shared parts of the two wgmma decode kernels (mla_decode_wgmma.cu: BF16 cache;
// mla_decode_wgmma_fp8.cu: FP8 cache): shared-memory layout, PTX wrappers, wgmma descriptors, the
// per-request work arithmetic and the two consumer warpgroups (S, softmax, P V, epilogue), which
// are the same for both caches: only the producer warpgroup differs. Included by exactly those
// two translation units (everything has internal linkage).
#pragma once
#include <cuda.h>           // CUtensorMap (types only: the driver entry point is fetched at run time)
#include <cudaTypedefs.h>   // PFN_cuTensorMapEncodeTiled

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "launch.h"
#include "wgmma.cuh"

namespace flashmla {
namespace {

constexpr int SLAB = 64 * 128;           // 64 rows x 64 bf16 columns, 128B-swizzled: 8 KiB
constexpr int NSLAB = D_QK / 64;         // 9 slabs per page and per Q tile
constexpr int TILE = NSLAB * SLAB;       // 73728 bytes
constexpr int BM = 64, NTHREADS = 384;
constexpr int OFF_Q = 0, OFF_K = TILE, OFF_PLO = OFF_K + 2 * TILE, OFF_MISC = OFF_PLO + SLAB;
// misc: 6 mbarriers (full[2], empty[2], q_full, q_empty; the FP8 kernel adds raw_full[2]), alpha[2][64], inv[2][64],
// then 64 bytes: the FP8 kernel's f16 consumers' q_ready (mbarrier), Q's scale 2^E and 4 floats of scratch, and the
// p_empty mbarrier
constexpr int MISC = 64 + 4 * 64 * 4 + 64;
constexpr int OFF_RAW_FULL = 48;  // FP8 kernel: raw_full[2] mbarriers at uBar + 48, + 56 (after the 6 above)
constexpr int OFF_QREADY = 64 + 4 * 64 * 4, OFF_QMUL = OFF_QREADY + 8, OFF_QRED = OFF_QREADY + 16;
constexpr int OFF_PEMPTY = OFF_QRED + 16;  // after the 4 floats of sQred
static_assert(OFF_PEMPTY % 8 == 0 && OFF_PEMPTY + 8 <= MISC, "p_empty must fit the misc area, 8-aligned");
constexpr int SMEM = OFF_MISC + MISC + 1024;  // + slack to align the base to 1024 bytes
static_assert(SMEM <= 232448, "shared memory over the sm_90 limit");
// named barriers (0 is __syncthreads); P_FULL alternates by page parity so that WG1 can arrive for
// page t+1 before WG2 has synced on page t, EPI by request parity likewise; WG1_ONLY orders WG1's
// own P stores before its P V
constexpr int BAR_P_FULL0 = 1, BAR_EPI0 = 3, BAR_P_FULL1 = 4, BAR_WG1_ONLY = 5, BAR_EPI1 = 6;
__device__ __forceinline__ int bar_p_full(int page) { return page & 1 ? BAR_P_FULL1 : BAR_P_FULL0; }
__device__ __forceinline__ int bar_epi(int req) { return req & 1 ? BAR_EPI1 : BAR_EPI0; }

// ---- PTX wrappers
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred P1;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE;\nbra WAIT;\nDONE:\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar) : "memory");
}
// 2^x in one MUFU.EX2 (exp2f adds a range check and two multiplies to keep results below 2^-126;
// flushing those to zero changes nothing here: P and alpha are at most 1 and are summed or scaled)
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {  // keep accumulator accesses in place
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// L2 policy of the page loads of a page that one CTA reads: evict first, so that the pages streamed through the L2
// displace each other rather than what stays in use (the split partials, which the combine reads back, and the
// request's Q, block table and metadata). H200, session 39: 1.02-1.03x at batch 64 x 4096 keys, the main kernel and
// the combine both faster
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
__device__ __forceinline__ void tma_load_2d_hint(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar,
                                                 uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "l"(policy) : "memory");
}
__device__ __forceinline__ void bulk_copy_hint(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy) : "memory");
}
// one contiguous global -> shared copy (cp.async.bulk), completing on the mbarrier at bar
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts16(uint32_t addr, uint16_t v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(v) : "memory");
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_zero16(uint32_t addr) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}

// wgmma shared-memory descriptors, 128B swizzle (layout type 1 in bits 62-63).
// K-major (rows of 128 bytes, 8-row groups 1024 bytes apart): LBO unused, SBO = 1024.
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
// MN-major B (V: 8-key groups of 128-byte rows 1024 bytes apart = SBO, 64-column slabs SLAB
// bytes apart = LBO).
__device__ __forceinline__ uint64_t desc_mnmajor(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(SLAB >> 4) << 16) |
         (64ull << 32) | (1ull << 62);
}
// byte offset of element (row r, column k) of a 64 x 64 bf16 slab with 128B swizzle
__device__ __forceinline__ uint32_t swz128(int r, int k) {
  return r * 128 + ((((k >> 3) ^ r) & 7) << 4) + (k & 7) * 2;
}

struct Work {  // one request's share of a scheduler part (the same arithmetic as mla_decode.cu)
  int nb, L, kbeg, kend, g;
  bool split;
};
__device__ __forceinline__ Work request_work(const DecodeArgs& a, int b, int b0, int k0, int b1, int k1, int first) {
  Work w;
  w.nb = min((max(a.seqlens[b], 0) + PAGE - 1) / PAGE, a.max_blocks);
  w.L = min(max(a.seqlens[b], 0), w.nb * PAGE);
  w.kbeg = b == b0 ? k0 : 0;
  w.kend = min(b == b1 ? k1 : w.nb, w.nb);
  w.split = a.num_splits[b + 1] - a.num_splits[b] > 1;
  w.g = first + (b - b0);
  return w;
}

// The lse of query row `row` (of m) of request b from its running max (exp2 domain) and row sum: natural log
// into lse [batch, h_q, s_q], or into the split partial's lacc; no key gives +inf there, -inf in a partial.
__device__ __forceinline__ void store_lse(const DecodeArgs& a, const Work& w, int b, int m, int row, float mrow, float l) {
  const bool empty = !(l > 0.f);
  const float lse = empty ? (w.split ? NEG_INF : -NEG_INF) : (mrow + log2f(l)) * LN2;
  const int i = row / a.h_q, hh = row - i * a.h_q;
  if (!w.split) a.lse[(int64_t)b * m + hh * a.s_q + i] = lse;
  else a.lacc[(int64_t)w.g * m + row] = lse;
}

// The largest of m and the magnitudes of the 8 bf16 values in v
__device__ __forceinline__ float absmax_bf16x8(uint4 v, float m) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]));
    m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
  }
  return m;
}
// The largest m of 128 threads (one warpgroup; named barrier bar, 4 floats of shared memory at red)
__device__ __forceinline__ float warpgroup_max(float m, float* red, int t, int bar) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((t & 31) == 0) red[t >> 5] = m;
  bar_sync(bar, 128);
  return fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
}
// Swap-AB S^T fragments (m64nNRk16, NR / 4 query columns per thread): each column's max over the warp's 16 keys
// (lanes gq = 0..7), into mx and, by the gq == 0 lanes, into smx[w4 * NR + column]
template <int NR>
__device__ __forceinline__ void column_max_to_smem(float (&mx)[NR / 4], float* smx, int w4, int gq, int cq) {
#pragma unroll
  for (int k = 0; k < NR / 4; ++k) {
    mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 4));
    mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 8));
    mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 16));
  }
  if (gq == 0) {
#pragma unroll
    for (int j = 0; j < NR / 8; ++j)
      *reinterpret_cast<float2*>(smx + w4 * NR + 8 * j + 2 * cq) = make_float2(mx[2 * j], mx[2 * j + 1]);
  }
}

// One CTA of either wgmma kernel: its shared-memory addresses (the same layout in both), its thread,
// its 64 query rows and its scheduler part [b0/k0, b1/k1).
struct CtaPart : Part {
  uint32_t uQ, uK, uPlo, uBar, bar_qfull, bar_qempty, bar_qready, bar_pempty;
  float* sQmul;   // f16 consumers: 2^E, Q's NoPE and RoPE parts were scaled by 2^-E (producer -> WG1)
  float* sQred;   // [4] f16 consumers: the producer warps' maxima of |Q|
  float* sAlpha;  // [2][64] row rescale factors by parity of the page (WG1 -> WG2)
  float* sInv;    // [2][64] 1/l by parity of the request (WG1 -> WG2)
  int tid, wg, t, m, row_base;
};

// Fills c from the launch and the metadata; false when the part is empty (the CTA exits at once).
// Otherwise thread 0 initialises the mbarriers (full[s] completing on full_arrivals arrivals plus the
// transaction bytes) and the CTA syncs.
__device__ __forceinline__ bool begin_cta(const DecodeArgs& a, uint8_t* smem_raw, int full_arrivals, CtaPart& c,
                                          bool raw_full = false, bool q_ready = false) {
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;  // dynamic shared memory aligned to 1024 here
  c.uQ = base + OFF_Q, c.uK = base + OFF_K, c.uPlo = base + OFF_PLO, c.uBar = base + OFF_MISC;
  c.bar_qfull = c.uBar + 32, c.bar_qempty = c.uBar + 40;
  c.sAlpha = reinterpret_cast<float*>(smem_raw + (base - raw) + OFF_MISC + 64);
  c.sInv = c.sAlpha + 2 * BM;
  c.bar_qready = c.uBar + OFF_QREADY, c.bar_pempty = c.uBar + OFF_PEMPTY;
  c.sQmul = reinterpret_cast<float*>(smem_raw + (base - raw) + OFF_MISC + OFF_QMUL);
  c.sQred = reinterpret_cast<float*>(smem_raw + (base - raw) + OFF_MISC + OFF_QRED);
  c.tid = threadIdx.x, c.wg = c.tid >> 7, c.t = c.tid & 127;
  c.m = a.s_q * a.h_q, c.row_base = blockIdx.x * BM;
  if (!load_part(a.meta, a.batch, c)) return false;
  if (c.tid == 0) {
    for (int s = 0; s < 2; ++s) {
      mbar_init(c.uBar + 8 * s, full_arrivals);
      mbar_init(c.uBar + 16 + 8 * s, 256);  // empty[s]: every consumer thread after its P V
    }
    mbar_init(c.bar_qfull, 1);
    mbar_init(c.bar_qempty, 128);           // WG1 after the last S of a request
    if (raw_full) {                         // FP8 wgmma kernel: raw_full[s] (expect_tx + bytes)
      mbar_init(c.uBar + OFF_RAW_FULL, 1);
      mbar_init(c.uBar + OFF_RAW_FULL + 8, 1);
    }
    if (q_ready) mbar_init(c.bar_qready, 128);  // f16 consumers: the producer warpgroup converted Q
    mbar_init(c.bar_pempty, 128);               // WG2 after its P V of a hi/lo page (P_lo is free)
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    fence_async_smem();
  }
  __syncthreads();
  return true;
}

// O columns owned by each consumer warpgroup, in blocks of 128: WG1 (S, softmax) the first W1, WG2
// the other 512 - W1. W1 = 256 splits P V evenly; W1 = 128 hands a quarter of it from WG1, whose S
// and softmax are the critical path of every page, to WG2, which otherwise waits while WG1 runs S.
template <int NB>
__device__ __forceinline__ void rescale_rows(float (&o)[NB][64], float al0, float al1) {
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[b][j * 4 + 0] *= al0;
      o[b][j * 4 + 1] *= al0;
      o[b][j * 4 + 2] *= al1;
      o[b][j * 4 + 3] *= al1;
    }
}
// O[:, blocks] += P[:, 16 keys] V[16 keys, blocks]: pairs of blocks as one n256 wgmma, an odd last
// block as n128. dv addresses the warpgroup's first V slab (128 columns = 2 slabs, SLAB bytes apart).
// F16: P and V as f16 (the FP8 kernel's f16 consumers), else bf16.
template <int NB, bool F16 = false>
__device__ __forceinline__ void pv_step(float (&o)[NB][64], uint64_t dp, uint64_t dv) {
#pragma unroll
  for (int b = 0; b + 1 < NB; b += 2) {
    if constexpr (F16) wgmma_m64n256k16_tb2_f16(o[b], o[b + 1], dp, dv + ((b * 2 * SLAB) >> 4), 1);
    else wgmma_m64n256k16_tb2(o[b], o[b + 1], dp, dv + ((b * 2 * SLAB) >> 4), 1);
  }
  if constexpr (NB & 1) {
    if constexpr (F16) wgmma_m64n128k16_tb_f16(o[NB - 1], dp, dv + (((NB - 1) * 2 * SLAB) >> 4), 1);
    else wgmma_m64n128k16_tb(o[NB - 1], dp, dv + (((NB - 1) * 2 * SLAB) >> 4), 1);
  }
}

// keys of request w each of this thread's two rows sees: all, or under causal masking those up to its own
// position (bottom-right aligned: row rg is query token rg / h_q of s_q)
__device__ __forceinline__ void key_limits(const DecodeArgs& a, const Work& w, int row_base, const int (&r_loc)[2], int m,
                                           int (&lim)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rg = row_base + r_loc[h];
    lim[h] = (a.causal && rg < m) ? min(w.L, w.L - a.s_q + 1 + rg / a.h_q) : w.L;
  }
}
// S = Q K^T of the page in stage uKs into sacc: 36 k-steps of 16 over the 9 slabs (committed, not waited).
// F16: the NoPE slabs 0-7 of Q and K hold f16 (the RoPE slab stays bf16)
template <bool F16 = false>
__device__ __forceinline__ void issue_s(uint32_t uQ, uint32_t uKs, float (&sacc)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) sacc[i] = 0.f;
  fence_regs(sacc);
  wgmma_fence();
  const uint64_t dq = desc_kmajor(uQ), dk = desc_kmajor(uKs);  // + offset>>4 moves the start
#pragma unroll
  for (int kk = 0; kk < D_QK / 16; ++kk) {
    const uint32_t off = ((kk >> 2) * SLAB + (kk & 3) * 32) >> 4;
    if (F16 && kk < 32) wgmma_m64n64k16_f16(sacc, dq + off, dk + off, 1);
    else wgmma_m64n64k16(sacc, dq + off, dk + off, 1);
  }
  wgmma_commit();
}
// S of page blk to the exp2 domain, keys at or past a row's limit masked to -inf, and this thread's row
// maxima folded into mx. Only pages that reach past some row's last visible key need the mask (the last
// page of a request, and the causal tail): elsewhere scale alone.
__device__ __forceinline__ void scale_mask_max(float (&sacc)[32], int blk, int cq, const int (&lim)[2], float scale_log2,
                                               float (&mx)[2]) {
  const int key0 = blk * PAGE + 2 * cq;
  if (__all_sync(0xffffffffu, (blk + 1) * PAGE <= min(lim[0], lim[1]))) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      sacc[i] *= scale_log2;
      mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], sacc[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float v = key0 + i * 8 + (e & 1) < lim[e >> 1] ? sacc[i * 4 + e] * scale_log2 : NEG_INF;
        sacc[i * 4 + e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
  }
}
// rows past a request's length hold arbitrary data: zero rows valid..63 of the 8 V slabs of stage uKs
__device__ __forceinline__ void zero_v_tail(uint32_t uKs, int valid, int t) {
  for (int idx = t; idx < 8 * PAGE * 8; idx += 128) {
    const int r = (idx >> 3) & 63;
    if (r >= valid) st_shared_zero16(uKs + (idx >> 9) * SLAB + r * 128 + (idx & 7) * 16);
  }
}
// P = exp2(S - muse) as bf16 hi (LO: and lo) planes in 128B-swizzled K-major slabs; P row sums into lrow
template <bool LO, bool F16 = false>
__device__ __forceinline__ void write_p_planes(uint32_t uPhi, uint32_t uPlo, const float (&sacc)[32], const float (&muse)[2],
                                               const int (&r_loc)[2], int cq, float (&lrow)[2]) {
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float p0 = exp2_ftz(sacc[i * 4 + 2 * h] - muse[h]), p1 = exp2_ftz(sacc[i * 4 + 2 * h + 1] - muse[h]);
      lrow[h] += p0 + p1;
      const uint32_t off = swz128(r_loc[h], i * 8 + 2 * cq);
      if constexpr (F16) {
        const __half2 hi = __floats2half2_rn(p0, p1);
        st_shared_u32(uPhi + off, *reinterpret_cast<const uint32_t*>(&hi));
        if (LO) {
          const __half2 lo = __floats2half2_rn(p0 - __low2float(hi), p1 - __high2float(hi));
          st_shared_u32(uPlo + off, *reinterpret_cast<const uint32_t*>(&lo));
        }
      } else {
        const __nv_bfloat162 hi = __floats2bfloat162_rn(p0, p1);
        st_shared_u32(uPhi + off, *reinterpret_cast<const uint32_t*>(&hi));
        if (LO) st_shared_u32(uPlo + off, pack_bf16(p0 - __low2float(hi), p1 - __high2float(hi)));
      }
    }
}
// the running max rarely moves on long requests: skip the rescale when it did not for any row of the
// warp (alpha == 1 exactly)
template <int NB>
__device__ __forceinline__ void rescale_if_moved(float (&o)[NB][64], const float (&al)[2]) {
  if (__any_sync(0xffffffffu, al[0] != 1.f || al[1] != 1.f)) rescale_rows(o, al[0], al[1]);
}
// O[:, 64 vslab ..] += (P_hi + P_lo) V of the page in stage uKs (P_hi in its RoPE slab, P_lo at uPlo), V from
// slab vslab on as MN-major B (committed, not waited)
template <bool LO, bool F16 = false, int NB>
__device__ __forceinline__ void issue_pv_page(float (&o)[NB][64], uint32_t uKs, int vslab, uint32_t uPlo) {
#pragma unroll
  for (int j = 0; j < NB; ++j) fence_regs(o[j]);
  wgmma_fence();
  const uint64_t dv = desc_mnmajor(uKs + vslab * SLAB), dhi = desc_kmajor(uKs + 8 * SLAB), dlo = desc_kmajor(uPlo);
#pragma unroll
  for (int ks = 0; ks < PAGE / 16; ++ks) {  // 16 keys: 2 groups of 8 rows (2048 bytes) of V, 32 bytes of P
    pv_step<NB, F16>(o, dhi + ks * 2, dv + ks * 128);
    if (LO) pv_step<NB, F16>(o, dlo + ks * 2, dv + ks * 128);
  }
  wgmma_commit();
}
// every committed wgmma group of this warpgroup complete; O's registers read back in place
template <int NB>
__device__ __forceinline__ void wait_pv(float (&o)[NB][64]) {
  wgmma_wait0();
#pragma unroll
  for (int j = 0; j < NB; ++j) fence_regs(o[j]);
}
// epilogue of one of this thread's rows (h) of request b: O / l into out (bf16) or the split partials
// (fp32) from column col0 on; with_lse: lse too (natural log; +inf / -inf for a row without keys)
template <int NB>
__device__ __forceinline__ void store_row(const DecodeArgs& a, const Work& w, int b, int m, int rg, int col0,
                                          const float (&o)[NB][64], int h, float inv, bool with_lse, float mrow,
                                          float lrow) {
  if (!w.split) {
    __nv_bfloat16* orow = static_cast<__nv_bfloat16*>(a.out) + ((int64_t)b * m + rg) * D_V + col0;
#pragma unroll
    for (int k = 0; k < NB; ++k)
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<uint32_t*>(orow + k * 128 + j * 8) = pack_bf16(o[k][j * 4 + 2 * h] * inv, o[k][j * 4 + 2 * h + 1] * inv);
  } else {
    float* orow = a.oacc + ((int64_t)w.g * m + rg) * D_V + col0;
#pragma unroll
    for (int k = 0; k < NB; ++k)
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<float2*>(orow + k * 128 + j * 8) = make_float2(o[k][j * 4 + 2 * h] * inv, o[k][j * 4 + 2 * h + 1] * inv);
  }
  if (with_lse) store_lse(a, w, b, m, rg, mrow, lrow);
}

// The two consumer warpgroups (wg = 1, 2; t = thread index in the warpgroup) over the CTA's part
// [b0/k0, b1/k1). Page stage s: full[s] at uBar + 8s (the page's 9 slabs are ready), empty[s] at
// uBar + 16 + 8s (256 arrivals: both warpgroups are done with the stage). ZERO_TAIL: WG1 zeroes the
// V rows past a request's length in its last page (the BF16 kernel's TMA copies them raw; the FP8
// kernel's dequantising warps write zeros there themselves). W1: the O columns of WG1 (above).
// Hand-over per page (WG1 never waits for WG2): P_hi lives in the page's own stage (RoPE slab), alpha in a buffer per page
// parity, so only P_lo needs WG2 to be done before WG1 overwrites it (the p_empty mbarrier, hi/lo pages only:
// WG2 arrives after each, WG1 waits before each but the CTA's first; WG2 is never two arrivals ahead, as its
// next one follows WG1's publishing of a page that came after the wait).
// F16 (FP8 kernel, FLASHMLA_FP8_F16=1): Q's NoPE part, the dequantised K = V and P are f16; WG1 waits for
// q_ready (the producer's conversion of Q, scaled by 2^-E) instead of q_full, and scales S by 2^E.
template <bool ZERO_TAIL, int W1, bool F16 = false>
__device__ __forceinline__ void run_consumers(const DecodeArgs& a, const CtaPart& c) {
  static_assert(W1 == 128 || W1 == 256, "WG1 owns 128 or 256 of the 512 O columns");
  const uint32_t uQ = c.uQ, uK = c.uK, uPlo = c.uPlo, uBar = c.uBar, bar_qfull = c.bar_qfull, bar_qempty = c.bar_qempty;
  float* sAlpha = c.sAlpha;
  float* sInv = c.sInv;
  const int m = c.m, t = c.t, row_base = c.row_base;
  const int b0 = c.b0, k0 = c.k0, b1 = c.b1, k1 = c.k1, first = c.first, last = c.last;
  const int lane = t & 31, gq = lane >> 2, cq = lane & 3;
  const int r_loc[2] = {(t >> 5) * 16 + gq, (t >> 5) * 16 + gq + 8};  // this thread's two rows
  const float scale_log2 = a.softmax_scale * LOG2E;
  int it = 0, qn = 0, rq = 0, lo_pages = 0;

  for (int b = b0; b <= last && b < a.batch; ++b) {
    const Work w = request_work(a, b, b0, k0, b1, k1, first);
    if (w.split && w.g >= a.batch + a.parts) break;  // inconsistent metadata: never write out of bounds

    // One copy of the request body per warpgroup role (CH 0: WG1, 1: WG2) and P precision (LO: hi +
    // lo planes), so that the wgmma chains never sit behind a run-time branch on a value ptxas cannot
    // prove warpgroup-uniform (that serialises every wgmma: ptxas C7520) and each role keeps only its
    // own accumulators live.
    auto body = [&](auto lo_tag, auto ch_tag) {
      constexpr bool LO = decltype(lo_tag)::value;
      constexpr int CH = decltype(ch_tag)::value;
      constexpr int COL0 = CH == 0 ? 0 : W1, NB = (CH == 0 ? W1 : D_V - W1) / 128;
      float o[NB][64];                             // O[64 x NB*128] of this warpgroup, wgmma C layout
#pragma unroll
      for (int j = 0; j < NB; ++j)
#pragma unroll
        for (int i = 0; i < 64; ++i) o[j][i] = 0.f;
      float mrow[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.f, 0.f};
      int lim[2];
      key_limits(a, w, row_base, r_loc, m, lim);
      const bool has_pages = w.kbeg < w.kend;
      auto stage = [&](int i) { return uK + (i & 1) * TILE; };
      auto wait_full = [&](int i) { mbar_wait(uBar + 8 * (i & 1), (i >> 1) & 1); };

      // ---- mask, exp2-domain scale, running max and alpha of page blk; l rescaled
      float sl2 = scale_log2;  // S to the exp2 domain (f16 consumers: times Q's 2^E, set below)
      auto softmax = [&](int blk, float (&sacc)[32], float (&al)[2], float (&muse)[2]) {
        float mx[2] = {NEG_INF, NEG_INF};
        scale_mask_max(sacc, blk, cq, lim, sl2, mx);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
          const float mn = fmaxf(mrow[h], mx[h]);
          muse[h] = mn == NEG_INF ? 0.f : mn;
          al[h] = exp2_ftz(mrow[h] - muse[h]);
          mrow[h] = mn;
          lrow[h] *= al[h];
        }
      };
      // rows past the request's length hold arbitrary data: zero them in the V slabs of its last page
      auto zero_tail = [&](int blk, uint32_t uKs) {
        if (ZERO_TAIL && blk == w.nb - 1 && (w.L & (PAGE - 1))) zero_v_tail(uKs, w.L & (PAGE - 1), t);
      };
      // alpha of page i to WG2, then P of page i is published (WG1 arrives on P_FULL, WG2 syncs)
      auto publish = [&](int i, const float (&al)[2]) {
        if (cq == 0) {
          sAlpha[(i & 1) * BM + r_loc[0]] = al[0];
          sAlpha[(i & 1) * BM + r_loc[1]] = al[1];
        }
        fence_async_smem();
        bar_arrive(bar_p_full(i), 256);
        bar_sync(BAR_WG1_ONLY, 128);
      };
      if (has_pages && CH == 0) {
        mbar_wait(F16 ? c.bar_qready : bar_qfull, qn & 1);
        if (F16) sl2 = scale_log2 * *c.sQmul;  // (read after the wait)
      }
      qn += has_pages;
      if constexpr (CH == 1) {
        for (int blk = w.kbeg; blk < w.kend; ++blk, ++it) {
          wait_full(it);
          bar_sync(bar_p_full(it), 256);
          const float al[2] = {sAlpha[(it & 1) * BM + r_loc[0]], sAlpha[(it & 1) * BM + r_loc[1]]};
          rescale_if_moved(o, al);
          issue_pv_page<LO, F16>(o, stage(it), COL0 / 64, uPlo);
          wait_pv(o);
          if (LO) mbar_arrive(c.bar_pempty);
          // the last page's stage is released after the epilogue has read 1/l (below): that keeps WG1,
          // which never waits for WG2, less than two requests ahead (EPI barriers and 1/l by parity)
          if (blk + 1 < w.kend) mbar_arrive(uBar + 16 + 8 * (it & 1));
        }
      } else {
        for (int blk = w.kbeg; blk < w.kend; ++blk, ++it) {
          const uint32_t uKs = stage(it);
          wait_full(it);
          float sacc[32], al[2], muse[2];
          issue_s<F16>(uQ, uKs, sacc);
          wgmma_wait0();
          fence_regs(sacc);
          if (blk == w.kend - 1) mbar_arrive(bar_qempty);
          softmax(blk, sacc, al, muse);
          zero_tail(blk, uKs);
          if (LO && lo_pages > 0) mbar_wait(c.bar_pempty, (lo_pages - 1) & 1);  // WG2 is done with the last P_lo
          lo_pages += LO;
          write_p_planes<LO, F16>(uKs + 8 * SLAB, uPlo, sacc, muse, r_loc, cq, lrow);
          publish(it, al);
          rescale_if_moved(o, al);
          issue_pv_page<LO, F16>(o, uKs, COL0 / 64, uPlo);
          wait_pv(o);
          mbar_arrive(uBar + 16 + 8 * (it & 1));
        }
      }

      // ---- epilogue: WG1 owns m, l and lse; WG2 takes 1/l through shared memory
      float inv[2] = {0.f, 0.f};
      if constexpr (CH == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          lrow[h] += __shfl_xor_sync(0xffffffffu, lrow[h], 1);
          lrow[h] += __shfl_xor_sync(0xffffffffu, lrow[h], 2);
          inv[h] = lrow[h] > 0.f ? 1.f / lrow[h] : 0.f;
          if (has_pages && cq == 0) sInv[(rq & 1) * BM + r_loc[h]] = inv[h];
        }
        if (has_pages) bar_arrive(bar_epi(rq), 256);
      } else if (has_pages) {
        bar_sync(bar_epi(rq), 256);
        inv[0] = sInv[(rq & 1) * BM + r_loc[0]];
        inv[1] = sInv[(rq & 1) * BM + r_loc[1]];
        mbar_arrive(uBar + 16 + 8 * ((it - 1) & 1));
      }
      rq += has_pages;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rg = row_base + r_loc[h];
        if (rg >= m) continue;
        store_row(a, w, b, m, rg, COL0 + 2 * cq, o, h, inv[h], CH == 0 && cq == 0, mrow[h], lrow[h]);
      }
    };
    using WG1 = std::integral_constant<int, 0>;
    using WG2 = std::integral_constant<int, 1>;
    const bool lo = w.L < a.p_bf16_min_keys;  // short request: exact P
    if (c.wg == 1) {
      if (lo) body(std::true_type{}, WG1{});
      else body(std::false_type{}, WG1{});
    } else {
      if (lo) body(std::true_type{}, WG2{});
      else body(std::false_type{}, WG2{});
    }
  }
}

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  if (!fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }
  return fn;
}

// 2-D tensor map over rows of `row_elems` elements (`row_bytes` apart), boxes of box_rows (64) rows x
// 64 columns (128 bytes), 128B swizzle. The BF16 kernel maps q and the cache as rows of 576 bf16; the
// FP8 kernel maps the FP8 cache as rows of 328 bf16 (656 bytes) and loads the RoPE box at column 264;
// the swap-AB kernel maps q in boxes of its 16 or 32 rows.
bool make_map(CUtensorMap* map, const void* ptr, uint64_t row_elems, uint64_t row_bytes, uint64_t rows,
              CUtensorMapDataType dtype = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, uint32_t box_cols = 64,
              CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B, uint32_t box_rows = 64) {
  auto fn = encode_tiled();
  if (!fn) return false;
  cuuint64_t dims[2] = {static_cast<cuuint64_t>(row_elems), rows};
  cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};
  cuuint32_t box[2] = {box_cols, box_rows}, estr[2] = {1, 1};
  return fn(map, dtype, 2, const_cast<void*>(ptr), dims, strides, box, estr,
            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace
}  // namespace flashmla
