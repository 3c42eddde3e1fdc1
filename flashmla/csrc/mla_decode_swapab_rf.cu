// MLA decode, sm_90a, FP8 cache, 1..32 query rows (tiles of NR = 16 or 32): the swap-AB kernel with register-fed
// consumers (under auto or FLASHMLA_KERNEL=swapab; FLASHMLA_SWAPAB_RF=0 runs the bf16-stage kernel instead).
//
// Why: the swap-AB FP8 kernel (mla_decode_swapab_fp8.cu) writes each page dequantised to bf16 in shared memory
// and its wgmmas read it back: ~316 KiB of shared-memory traffic per 42 KiB page, which bounds it at 16 rows
// (Nsight Compute, BENCHMARKS.md session 17). In swap-AB the cache is the wgmma A operand, which may come from
// registers: here the consumers convert raw e4m3 bytes straight into A fragments (one cvt per pair of values),
// ~150 KiB per page.
//
// One CTA = one scheduler part, 384 threads, three warpgroups (setmaxnreg: 232 / 232 / 40):
//   WG2 (thread 256): producer. Each page (41,984 contiguous bytes) by one cp.async.bulk into a ring of
//     4 page slots (raw_full: expect_tx; raw_empty: 256 consumer arrivals); the request's Q rows into L2 after
//     its first page; L2 prefetch of pages a.l2_prefetch_pages ahead (kSwapabRfL2Prefetch = 0 unless
//     FLASHMLA_L2_PREFETCH is set).
//   WG0 ("S"): per request, Q's rows from global memory, the NoPE part to f16 scaled by 2^-E (max |Q| of the
//     live rows in (2^14, 2^15]), the RoPE part kept bf16, each k-step's 16 columns permuted to the fragment order
//     below. Per page: S^T[64 keys x NR rows] from A = raw K in registers: e4m3 -> f16 is exact, so each
//     128-column scale tile t gets its own accumulator S_t (8 wgmma m64nNRk16 f16), RoPE one more (4 bf16
//     wgmmas), and S = 2^E sum_t scale[key][t] S_t + S_rope in fp32 (NR = 16: every A fragment converted, then
//     the 36 wgmmas; NR = 32: batches of 4 k-steps, two in flight). Softmax in the exp2 domain against a
//     reference max per column that moves only when a page's max exceeds it by more than RF_MAX_SLACK (P <= 2^8,
//     so O^T is rarely rescaled); P^T in f16 (hi, and lo = f16(p - hi) for requests shorter than
//     a.p_bf16_min_keys) into plane (page & 1), the column rescale alpha beside it, then p_full. After a
//     request's last page: lse, and 1/l for WG1.
//   WG1 ("V"): O^T[512 x NR] += V^T P^T from A = raw V in registers: warp w's 128 value columns are scale
//     tile w, lane (g, c) owns the 16 columns 128w + 16g.. of m-tile rows g and g + 8 (m-tile mt: columns
//     2mt, 2mt + 1) and the keys 2c, 2c + 1, 2c + 8, 2c + 9 of each 16-key k-step: PRMT pairs two keys' bytes,
//     cvt gives f16x2, and HMUL2 applies scale[key][w] / sigma (sigma: the page's largest scale of the tile,
//     rounded up to a power of two, so the f16 products stay within [0, 448]); O^T is rescaled by the ratio of
//     sigmas between pages (exact) with alpha, and multiplied by sigma at the end. NR = 16: the whole page
//     converted (128 registers) and its slot released before P^T is waited; NR = 32 (O^T: 128 registers):
//     batches of 4 m-tiles of one k-step, two converted before P^T is waited, the slot released after the last.
// FLASHMLA_FP8_Q=1 (Q8): WG0 rounds Q's NoPE part to e4m3 per query row (rf_convert_q8; its 2^e per row applied to
//   S in fp32) and issues S's NoPE part as 16 e4m3 wgmmas m64nNRk32 on the raw key bytes as loaded (rf_issue_s8):
//   no conversion, half the tensor work; V's side is unchanged.
// FLASHMLA_FP8_PV=1 (PV8, 16-row tile): for requests of at least a.p_bf16_min_keys keys WG0 also takes each page's
//   largest live scale per tile across its warps (sigma, a power of two, in sSig for WG1) and writes P^T in e4m3 with
//   scale[key][tile] / sigma folded in, one plane per tile; WG1 (rf_v_request_e4m3) feeds V's raw bytes to e4m3
//   wgmmas m64n16k32 (m-tiles of one scale tile each) and adds each page's sums to O^T in fp32.
// Layout of K's A fragment (S^T): warp w's keys 16w + g and 16w + g + 8; lane c reads bytes [32c, 32c + 32)
// of each 128-column tile, word j of them (columns 32c + 4j ..+3) feeding k-step 8t + j: columns
// 32c + 4j + {0, 1} are the fragment's k = 2c, 2c + 1 and + {2, 3} its k = 2c + 8, 2c + 9. The Q tile stores
// each column at that k (rf_convert_q), so S is unchanged by the permutation. RoPE the same within 64 columns.
// Shared memory: ring 4 x 41,984 | Q f16/bf16 NR x 1,152 | P^T planes 2 x (hi, lo) x NR x 128 (PV8: 2 x 4 e4m3 tiles of
// NR x 64) | mbarriers, sMax / sL [2][4][NR], alpha / 1/l [2][NR], Q max [4], Q's 2^e [NR], PV8's scale maxima [2][4][4]
// and sigmas [2][4]: 197,632 (NR = 16) / 225,280 (32) bytes with the slack.
// CPU model of the maps and the barrier protocol: csrc/models/swapab_rf_model.py (update together).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "wgmma_common.cuh"

namespace flashmla {
namespace {

constexpr int RF_TOKEN = 656, RF_PAGE = PAGE * RF_TOKEN;
// Shared memory of the NR-row instantiation (NR = 16 or 32 query rows): 4 page slots, the Q tile and the P^T planes
template <int NR>
struct RfLayout {
  static constexpr int SLOTS = 4, QSLAB = NR * 128, OFF_QF = SLOTS * RF_PAGE;
  static constexpr int OFF_P = OFF_QF + NSLAB * QSLAB, OFF_MISC = OFF_P + 4 * QSLAB;
  // 128 B of mbarriers, 21 NR + 4 floats, then FLASHMLA_FP8_PV's 40 (NR = 16 only)
  static constexpr int MISC = NR == 16 ? 2048 : 3072, SMEM = OFF_MISC + MISC + 1024;
  static_assert(OFF_QF % 1024 == 0 && OFF_P % 1024 == 0, "swizzled tiles: 1 KiB aligned");
  static_assert(SMEM <= 232448, "shared memory");
};
static_assert(RF_PAGE % 16 == 0 && RfLayout<16>::SMEM == 197632 && RfLayout<32>::SMEM == 225280, "as documented");
constexpr int RF_THREADS = 384, RF_PRODUCER_REGS = 40, RF_CONSUMER_REGS = 232;
static_assert((168 - RF_PRODUCER_REGS) >= 2 * (RF_CONSUMER_REGS - 168), "setmaxnreg pool overdrawn");
constexpr int RF_BAR_SMAX = 1, RF_BAR_SL = 2, RF_BAR_Q = 3;  // named barriers of WG0
// A column's reference max moves only when a page's max exceeds it by more than this (exp2 domain): P <= 2^8 in
// f16, and O^T is rescaled on few pages
constexpr float RF_MAX_SLACK = 8.f;
// How P^T reaches V's wgmmas, per request: f16 (P_F16), f16 hi + lo (P_F16LO: shorter than a.p_bf16_min_keys), or
// (FLASHMLA_FP8_PV=1, 16-row tile, requests of at least a.p_bf16_min_keys keys) e4m3 with the keys' tile scales
// folded in (P_E4M3: four planes, one per scale tile; V's raw bytes are the A operand, see rf_v_request_e4m3)
enum RfP { RF_P_F16, RF_P_F16LO, RF_P_E4M3 };

template <int NR>
struct RfCta : Part {
  using L = RfLayout<NR>;
  uint32_t uRaw, uQF, uP, uBar;
  float *sMax, *sL, *sAlpha, *sInv, *sQred, *sQs;  // [2][4][NR], [2][4][NR], [2][NR], [2][NR], [4], [NR]
  float *sSmx, *sSig;  // RF_P_E4M3: [2][4 warps][4 tiles] largest live scales, [2][4] sigma per tile (WG0 -> WG1)
  int m;
  __device__ uint32_t raw_full(int s) const { return uBar + 8 * s; }
  __device__ uint32_t raw_empty(int s) const { return uBar + 32 + 8 * s; }
  __device__ uint32_t p_full(int s) const { return uBar + 64 + 8 * s; }
  __device__ uint32_t p_empty(int s) const { return uBar + 80 + 8 * s; }
  __device__ uint32_t plane(int parity, int lo) const { return uP + (2 * parity + lo) * L::QSLAB; }
};

// D[64xNR] += A[64x16] (registers: 4 x f16x2, or bf16x2 when !F16) B[16xNR] (K-major descriptor), NR = 16 or 32
#define RF_ACC8 "{%0, %1, %2, %3, %4, %5, %6, %7"
#define RF_ACC16 RF_ACC8 ", %8, %9, %10, %11, %12, %13, %14, %15}"
#define RF_OUT8(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
// (scale-d: the immediate ACCUMULATE, operand SD)
#define RF_WGMMA_RS(SHAPE, AB, ACC, AREG, SD, ...) \
  asm volatile("wgmma.mma_async.sync.aligned." SHAPE ".f32." AB "." AB " " ACC ", " AREG ", " SD ", 1, 1, 0;\n" \
               : __VA_ARGS__ : "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3]), "l"(db), "n"(ACCUMULATE))
// ACCUMULATE = 0: D = A B (the old D ignored: no zeroing of the accumulators before a page's first k-step)
template <int NR, bool F16, int ACCUMULATE = 1>
__device__ __forceinline__ void wgmma_rs(float (&d)[NR / 2], const uint32_t (&x)[4], uint64_t db) {
  if constexpr (NR == 16 && F16)
    RF_WGMMA_RS("m64n16k16", "f16", RF_ACC8 "}", "{%8, %9, %10, %11}, %12", "%13", RF_OUT8(d));
  else if constexpr (NR == 16)
    RF_WGMMA_RS("m64n16k16", "bf16", RF_ACC8 "}", "{%8, %9, %10, %11}, %12", "%13", RF_OUT8(d));
  else if constexpr (F16)
    RF_WGMMA_RS("m64n32k16", "f16", RF_ACC16, "{%16, %17, %18, %19}, %20", "%21", RF_OUT8(d), RF_OUT8((d + 8)));
  else
    RF_WGMMA_RS("m64n32k16", "bf16", RF_ACC16, "{%16, %17, %18, %19}, %20", "%21", RF_OUT8(d), RF_OUT8((d + 8)));
}
// D[64xNR] += A[64x32] (registers: 4 x e4m3x4) B[32xNR] (e4m3, K-major descriptor): S^T of FLASHMLA_FP8_Q=1
template <int NR, int ACCUMULATE = 1>
__device__ __forceinline__ void wgmma_rs_e4m3(float (&d)[NR / 2], const uint32_t (&x)[4], uint64_t db) {
  if constexpr (NR == 16)
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 " RF_ACC8 "}, {%8, %9, %10, %11}, %12, %13, 1, 1;\n"
                 : RF_OUT8(d) : "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3]), "l"(db), "n"(ACCUMULATE));
  else
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 " RF_ACC16 ", {%16, %17, %18, %19}, %20, %21, 1, 1;\n"
                 : RF_OUT8(d), RF_OUT8((d + 8)) : "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3]), "l"(db), "n"(ACCUMULATE));
}
#undef RF_WGMMA_RS
#undef RF_ACC8
#undef RF_ACC16
#undef RF_OUT8
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void fence_u32(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}
// e4m3 pair -> f16x2, exact (low byte -> low half): of the word's low (H = 0) or high (H = 1) 16 bits, which the
// conversion selects itself (F2FP ... R.H1: no shift)
template <int H>
__device__ __forceinline__ uint32_t f16x2_of_e4m3x2(uint32_t word) {
  uint32_t r;
  if constexpr (H == 0)
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, l;\n}\n" : "=r"(r) : "r"(word));
  else
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, h;\n}\n" : "=r"(r) : "r"(word));
  return r;
}
__device__ __forceinline__ uint32_t f16x2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t hmul2(uint32_t x, uint32_t y) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(y));
  return r;
}
__device__ __forceinline__ uint32_t prmt(uint32_t x, uint32_t y, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(y), "r"(sel));
  return r;
}
__device__ __forceinline__ uint32_t lds32u(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
// 2^k as a float from its biased exponent field k << 23 (k in [1, 253])
__device__ __forceinline__ uint32_t pow2_field_ceil(float x) {  // the least 2^k >= x (x >= 0 finite; 1 for x = 0)
  if (!(x > 0.f)) return 127u << 23;
  const uint32_t u = __float_as_uint(x);
  uint32_t e = (u & 0x7f800000u) + ((u & 0x7fffffu) ? 0x800000u : 0u);
  e = e < (1u << 23) ? (1u << 23) : e;
  return e > (253u << 23) ? (253u << 23) : e;
}
// 2^-k as a float from the field k << 23 of 2^k (k in [1, 253]): exact
__device__ __forceinline__ float pow2_field_inverse(uint32_t field) { return __uint_as_float((254u << 23) - field); }
// query column k = 0..NR / 4 - 1 of this thread (lane & 3 = cq): row n of the request's NR
__device__ __forceinline__ int rf_col(int k, int cq) { return 8 * (k >> 1) + 2 * cq + (k & 1); }

// ---------------------------------------------------------------- producer (one thread)
template <int NR>
__device__ __forceinline__ void rf_producer(const DecodeArgs& a, const RfCta<NR>& c) {
  using L = RfLayout<NR>;
  const uint8_t* kc8 = static_cast<const uint8_t*>(a.kcache);
  const uint8_t* q8 = static_cast<const uint8_t*>(a.q);
  int it = 0;
  const uint64_t pol = l2_policy_evict_first();
  for (int b = c.b0; b <= c.last && b < a.batch; ++b) {
    const Work w = request_work(a, b, c.b0, c.k0, c.b1, c.k1, c.first);
    if (w.split && w.g >= a.batch + a.parts) break;
    if (w.kbeg >= w.kend) continue;
    const int* bt = a.block_table + (int64_t)b * a.bt_stride;
    const int pf = a.l2_prefetch_pages;
    for (int p = w.kbeg + 1; p < min(w.kbeg + pf, w.kend); ++p) prefetch_l2_bulk(kc8 + (int64_t)bt[p] * RF_PAGE, RF_PAGE);
    for (int blk = w.kbeg; blk < w.kend; ++blk, ++it) {
      if (pf > 0 && blk + pf < w.kend) prefetch_l2_bulk(kc8 + (int64_t)bt[blk + pf] * RF_PAGE, RF_PAGE);
      const int s = it % L::SLOTS;
      mbar_wait(c.raw_empty(s), ((it / L::SLOTS) & 1) ^ 1);
      mbar_expect_tx(c.raw_full(s), RF_PAGE);
      bulk_copy_hint(c.uRaw + s * RF_PAGE, kc8 + (int64_t)bt[blk] * RF_PAGE, RF_PAGE, c.raw_full(s), pol);
      // the request's Q rows into L2 after its first page (WG0 reads them from global memory)
      if (blk == w.kbeg) prefetch_l2_bulk(q8 + (int64_t)b * c.m * (D_QK * 2), c.m * (D_QK * 2));
    }
  }
}

// ---------------------------------------------------------------- WG0: Q, S, softmax, P^T (t = 0..127)
// Two words of 16-bit Q values (columns 2cc.., 2cc + 8..) of row n at k-step kk of the Q tile
template <int NR>
__device__ __forceinline__ void rf_store_q_words(const RfCta<NR>& c, int n, int kk, int cc, uint32_t lo, uint32_t hi) {
  const uint32_t dst = c.uQF + (kk >> 2) * RfLayout<NR>::QSLAB, col = (kk & 3) * 16 + 2 * cc;
  st_shared_u32(dst + swz128(n, col), lo);
  st_shared_u32(dst + swz128(n, col + 8), hi);
}
// The request's Q rows (bf16, global memory) -> the f16 / bf16 B operand of S (see the header); returns 2^E.
// Thread t converts columns 8(t & 7) + 64 sl.. of rows (t >> 3) + 16 hh (zeros for rows past the request's m).
template <int NR>
__device__ __forceinline__ float rf_convert_q(const DecodeArgs& a, const RfCta<NR>& c, int b, int t) {
  const int ch = t & 7;
  uint4 v[NR / 16][NSLAB];
  float mx = 0.f;
#pragma unroll
  for (int hh = 0; hh < NR / 16; ++hh) {
    const int n = (t >> 3) + 16 * hh;
    const uint4* src = static_cast<const uint4*>(a.q) + ((int64_t)b * c.m + n) * (D_QK / 8) + ch;
#pragma unroll
    for (int sl = 0; sl < NSLAB; ++sl) v[hh][sl] = n < c.m ? __ldg(src + 8 * sl) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int sl = 0; sl < 8; ++sl) mx = absmax_bf16x8(v[hh][sl], mx);
  }
  mx = warpgroup_max(mx, c.sQred, t, RF_BAR_Q);  // (its barrier also: WG0's S of the previous request is done with uQF)
  int e = 0;  // max |Q| 2^-E in (2^14, 2^15]
  if (mx > 0.f) {
    const uint32_t u = __float_as_uint(mx);
    e = min(max((int)(u >> 23) - 127 + ((u & 0x7fffffu) != 0) - 15, -126), 126);
  }
  const float down = __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
#pragma unroll
  for (int hh = 0; hh < NR / 16; ++hh) {
    const int n = (t >> 3) + 16 * hh;
#pragma unroll
    for (int sl = 0; sl < NSLAB; ++sl) {
      const uint32_t w[4] = {v[hh][sl].x, v[hh][sl].y, v[hh][sl].z, v[hh][sl].w};
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // 4 columns: d0 = 8ch + 4h of the slab
        const int d0 = 8 * ch + 4 * h;
        int kk, cc;
        uint32_t lo = w[2 * h], hi = w[2 * h + 1];
        if (sl < 8) {
          const int d = 64 * sl + d0, r = d & 127;
          kk = 8 * (d >> 7) + ((r >> 2) & 7), cc = r >> 5;
          const float2 f0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&lo));
          const float2 f1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&hi));
          lo = f16x2(f0.x * down, f0.y * down), hi = f16x2(f1.x * down, f1.y * down);
        } else {
          kk = 32 + ((d0 >> 2) & 3), cc = d0 >> 4;
        }
        rf_store_q_words(c, n, kk, cc, lo, hi);
      }
    }
  }
  fence_async_smem();
  bar_sync(RF_BAR_Q, 128);
  return __uint_as_float(static_cast<uint32_t>(127 + e) << 23);
}

// FLASHMLA_FP8_Q=1: the request's Q rows -> B operand of S with the NoPE part in e4m3, row n scaled by 2^-e[n] (the
// least e with max |Q[n, :512]| 2^-e <= 448: e = E - 8, or E - 7 above 1.75 2^E; clamped to [-100, 100]; 2^e[n]
// into sQs[n]), each k-step's 32 bytes permuted to the fragment order of rf_issue_s8; RoPE bf16 as in rf_convert_q.
// flashmla.testing.fp8_query rounds the same way. Thread t: columns 8(t & 7) + 64 sl.. of rows (t >> 3) + 16 hh.
// Returns 1 (the factor rf_convert_q's 2^E stands for: here per row, in sQs).
template <int NR>
__device__ __forceinline__ float rf_convert_q8(const DecodeArgs& a, const RfCta<NR>& c, int b, int t) {
  constexpr int QSLAB = RfLayout<NR>::QSLAB;
  const int ch = t & 7;
  bar_sync(RF_BAR_Q, 128);  // WG0's S of the previous request is done with uQF and sQs
#pragma unroll
  for (int hh = 0; hh < NR / 16; ++hh) {
    const int n = (t >> 3) + 16 * hh;
    const uint4* src = static_cast<const uint4*>(a.q) + ((int64_t)b * c.m + n) * (D_QK / 8) + ch;
    uint4 v[NSLAB];
    float mx = 0.f;
#pragma unroll
    for (int sl = 0; sl < NSLAB; ++sl) v[sl] = n < c.m ? __ldg(src + 8 * sl) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int sl = 0; sl < 8; ++sl) mx = absmax_bf16x8(v[sl], mx);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    const uint32_t u = __float_as_uint(mx);
    const int e = mx > 0.f ? min(max((int)(u >> 23) - 135 + ((u & 0x7fffffu) > 0x600000u), -100), 100) : 0;
    if (ch == 0) c.sQs[n] = __uint_as_float(static_cast<uint32_t>(127 + e) << 23);
    const float down = __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
#pragma unroll
    for (int sl = 0; sl < NSLAB; ++sl) {
      const uint32_t w[4] = {v[sl].x, v[sl].y, v[sl].z, v[sl].w};
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // 4 columns: d0 = 8ch + 4h of the slab
        const int d0 = 8 * ch + 4 * h;
        uint32_t lo = w[2 * h], hi = w[2 * h + 1];
        if (sl < 8) {  // column 128 tl + 32 cq + 16 hf + 8 p + 4 x: k-step 4 tl + 2 hf + p, bytes 16 x + 4 cq..
          const int r = (64 * sl + d0) & 127;
          const int col = ((r >> 4) & 1) * 64 + ((r >> 3) & 1) * 32 + ((r >> 2) & 1) * 16 + (r >> 5) * 4;
          const float2 f0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&lo));
          const float2 f1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&hi));
          const uint32_t p0 = __nv_cvt_float2_to_fp8x2(make_float2(f0.x * down, f0.y * down), __NV_SATFINITE, __NV_E4M3);
          const uint32_t p1 = __nv_cvt_float2_to_fp8x2(make_float2(f1.x * down, f1.y * down), __NV_SATFINITE, __NV_E4M3);
          st_shared_u32(c.uQF + (sl >> 1) * QSLAB + swz128(n, col >> 1), p0 | (p1 << 16));
        } else {
          rf_store_q_words(c, n, 32 + ((d0 >> 2) & 3), d0 >> 4, lo, hi);
        }
      }
    }
  }
  fence_async_smem();
  bar_sync(RF_BAR_Q, 128);
  return 1.f;
}

// lse of the request's query columns of this thread (l: their row sums; WG0 lanes with gq == 0 of warp 0)
template <int NR>
__device__ __forceinline__ void rf_write_lse(const DecodeArgs& a, const RfCta<NR>& c, const Work& w, int b, int cq,
                                             const float (&mrow)[NR / 4], const float (&l)[NR / 4]) {
#pragma unroll
  for (int k = 0; k < NR / 4; ++k) {
    const int n = rf_col(k, cq);
    if (n < c.m) store_lse(a, w, b, c.m, n, mrow[k], l[k]);
  }
}

// The Q tile's B descriptor dq moved to k-step kk (32 bytes each, 4 per slab)
template <int NR>
__device__ __forceinline__ uint64_t rf_q_desc(uint64_t dq, int kk) {
  return dq + (((kk >> 2) * RfLayout<NR>::QSLAB + (kk & 3) * 32) >> 4);
}

// S^T's accumulators (the four scale tiles' and RoPE's) pinned in place around wgmma issues and waits
template <int NR>
__device__ __forceinline__ void fence_s(float (&st)[4][NR / 2], float (&sr)[NR / 2]) {
#pragma unroll
  for (int tl = 0; tl < 4; ++tl) fence_regs(st[tl]);
  fence_regs(sr);
}

// RoPE's A fragments of k-steps 32..35 (bf16 as stored) from the raw keys tok0 / tok1
__device__ __forceinline__ void rf_load_rope(uint32_t tok0, uint32_t tok1, int cq, uint32_t (&f)[4][4]) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const uint32_t off = D_V + 16 + 32 * cq + 16 * hf;
    const uint4 x0 = lds128(tok0 + off), x1 = lds128(tok1 + off);
    f[2 * hf][0] = x0.x, f[2 * hf][1] = x1.x, f[2 * hf][2] = x0.y, f[2 * hf][3] = x1.y;
    f[2 * hf + 1][0] = x0.z, f[2 * hf + 1][1] = x1.z, f[2 * hf + 1][2] = x0.w, f[2 * hf + 1][3] = x1.w;
  }
}

// FLASHMLA_FP8_Q=1: S^T of one page as rf_issue_s, the NoPE part by e4m3 wgmma m64nNRk32 straight from the raw bytes
// (no conversion): bytes [32cq + 16hf, +16) of each key's tile tl are k-steps 4tl + 2hf + {0, 1}, words 2p and
// 2p + 1 their fragment's k = 4cq.. and 16 + 4cq.. (rf_convert_q8 stores Q in that order)
template <int NR, class During>
__device__ __forceinline__ void rf_issue_s8(uint32_t tok0, uint32_t tok1, int cq, uint64_t dq, float (&st)[4][NR / 2],
                                            float (&sr)[NR / 2], uint4 (&r)[2], During&& during) {
  auto db_of = [&](int kk) { return rf_q_desc<NR>(dq, kk); };
  // NR = 16: every fragment loaded first; NR = 32 (80 accumulator registers): tiles 0-1, tiles 2-3, then RoPE in
  // tiles 0-1's registers once their wgmmas are done
  uint32_t ak[2][8][4], ar[4][4];
  auto load = [&](int half) {
#pragma unroll
    for (int kp = 0; kp < 4; ++kp) {
      const uint32_t o = 256 * half + 128 * (kp >> 1) + 32 * cq + 16 * (kp & 1);
      const uint4 x0 = lds128(tok0 + o), x1 = lds128(tok1 + o);
      uint32_t(&f)[8][4] = ak[half];
      f[2 * kp][0] = x0.x, f[2 * kp][1] = x1.x, f[2 * kp][2] = x0.y, f[2 * kp][3] = x1.y;
      f[2 * kp + 1][0] = x0.z, f[2 * kp + 1][1] = x1.z, f[2 * kp + 1][2] = x0.w, f[2 * kp + 1][3] = x1.w;
    }
    fence_u32(ak[half]);
  };
  auto issue = [&](int half) {
    fence_s<NR>(st, sr);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int kk = 8 * half + j;
      if ((kk & 3) == 0) wgmma_rs_e4m3<NR, 0>(st[kk >> 2], ak[half][j], db_of(kk));
      else wgmma_rs_e4m3<NR>(st[kk >> 2], ak[half][j], db_of(kk));
    }
  };
  auto issue_rope = [&]() {
    wgmma_rs<NR, false, 0>(sr, ar[0], db_of(32));
#pragma unroll
    for (int j = 1; j < 4; ++j) wgmma_rs<NR, false>(sr, ar[j], db_of(32 + j));
  };
  r[0] = lds128(tok0 + D_V), r[1] = lds128(tok1 + D_V);
  if constexpr (NR == 16) {
    rf_load_rope(tok0, tok1, cq, ar);
    load(0);
    load(1);
    fence_u32(ar);
    issue(0);
    issue(1);
    issue_rope();
  } else {
    load(0);
    issue(0);
    wgmma_commit();
    load(1);
    issue(1);
    wgmma_commit();
    wgmma_wait1();  // tiles 0-1 are read: their registers take RoPE
    rf_load_rope(tok0, tok1, cq, ar);
    fence_u32(ar);
    fence_regs(sr);
    wgmma_fence();
    issue_rope();
  }
  wgmma_commit();
  during();
  wgmma_wait0();
  fence_s<NR>(st, sr);
}

// S^T of one page into st (per scale tile) and sr (RoPE) from this thread's raw keys tok0 / tok1 (committed and
// waited; during() runs while the last wgmmas do), and the keys' tile scales into r. 16 rows: every A fragment
// converted first (144 registers); 32 rows: batches of 4 k-steps, two in flight.
template <int NR, class During>
__device__ __forceinline__ void rf_issue_s(uint32_t tok0, uint32_t tok1, int cq, uint64_t dq, float (&st)[4][NR / 2],
                                           float (&sr)[NR / 2], uint4 (&r)[2], During&& during) {
  auto db_of = [&](int kk) { return rf_q_desc<NR>(dq, kk); };
  // k-steps 8tl + 4hf + q (q = 0..3) of tile tl: bytes [32cq + 16hf, +16) of both keys' 128-byte tile
  auto nope = [&](int tl, int hf, uint32_t(&f)[4][4]) {
    const uint32_t off = 128 * tl + 32 * cq + 16 * hf;
    const uint4 x0 = lds128(tok0 + off), x1 = lds128(tok1 + off);
    const uint32_t u0[4] = {x0.x, x0.y, x0.z, x0.w}, u1[4] = {x1.x, x1.y, x1.z, x1.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      f[q][0] = f16x2_of_e4m3x2<0>(u0[q]), f[q][1] = f16x2_of_e4m3x2<0>(u1[q]);
      f[q][2] = f16x2_of_e4m3x2<1>(u0[q]), f[q][3] = f16x2_of_e4m3x2<1>(u1[q]);
    }
  };
  auto rope = [&](uint32_t(&f)[4][4]) { rf_load_rope(tok0, tok1, cq, f); };
  // k-step kk (0..35) into its accumulator; the first of each one overwrites it
  auto mma = [&](int kk, const uint32_t(&x)[4]) {
    if (kk == 32) wgmma_rs<NR, false, 0>(sr, x, db_of(kk));
    else if (kk > 32) wgmma_rs<NR, false>(sr, x, db_of(kk));
    else if ((kk & 7) == 0) wgmma_rs<NR, true, 0>(st[kk >> 3], x, db_of(kk));
    else wgmma_rs<NR, true>(st[kk >> 3], x, db_of(kk));
  };
  if constexpr (NR == 16) {
    uint32_t ak[8][4][4], ar[4][4];
    rope(ar);  // (loads first: their latency hides behind the conversions)
    r[0] = lds128(tok0 + D_V), r[1] = lds128(tok1 + D_V);
#pragma unroll
    for (int bt = 0; bt < 8; ++bt) nope(bt >> 1, bt & 1, ak[bt]);
#pragma unroll
    for (int bt = 0; bt < 8; ++bt) fence_u32(ak[bt]);
    fence_u32(ar);
    fence_s<NR>(st, sr);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D_QK / 16; ++kk) mma(kk, kk < 32 ? ak[kk >> 2][kk & 3] : ar[kk - 32]);
    wgmma_commit();
  } else {
    r[0] = lds128(tok0 + D_V), r[1] = lds128(tok1 + D_V);
    uint32_t f[2][4][4];
#pragma unroll
    for (int bt = 0; bt < 9; ++bt) {
      uint32_t(&fb)[4][4] = f[bt & 1];
      if (bt >= 2) wgmma_wait1();  // batch bt - 2 has read this buffer
      if (bt < 8) nope(bt >> 1, bt & 1, fb);
      else rope(fb);
      fence_u32(fb);
      fence_s<NR>(st, sr);
      wgmma_fence();
#pragma unroll
      for (int q = 0; q < 4; ++q) mma(4 * bt + q, fb[q]);
      wgmma_commit();
    }
  }
  during();
  wgmma_wait0();
  fence_s<NR>(st, sr);
}

template <int NR, RfP PM, bool Q8>
__device__ __forceinline__ void rf_s_request(const DecodeArgs& a, const RfCta<NR>& c, const Work& w, int b, int t,
                                             int& it, int rq, float qmul) {
  constexpr int NQ = NR / 4, SLOTS = RfLayout<NR>::SLOTS;  // query columns per thread
  const int w4 = t >> 5, lane = t & 31, gq = lane >> 2, cq = lane & 3;
  const float scale_log2 = a.softmax_scale * LOG2E;
  float qs_log2[NQ], mrow[NQ], lrow[NQ];  // (qs: Q's scale, 2^E or under Q8 the row's 2^e, in the exp2 domain)
  int lim[NQ];
#pragma unroll
  for (int k = 0; k < NQ; ++k) {
    const int n = rf_col(k, cq);
    mrow[k] = NEG_INF, lrow[k] = 0.f, qs_log2[k] = (Q8 ? c.sQs[n] : qmul) * scale_log2;
    lim[k] = (a.causal && n < c.m) ? min(w.L, w.L - a.s_q + 1 + n / a.h_q) : w.L;
  }
  const uint64_t dq = desc_kmajor(c.uQF);
  for (int blk = w.kbeg; blk < w.kend; ++blk, ++it) {
    const int s = it % SLOTS, par = it & 1;
    mbar_wait(c.raw_full(s), (it / SLOTS) & 1);
    const uint32_t tok0 = c.uRaw + s * RF_PAGE + (16 * w4 + gq) * RF_TOKEN, tok1 = tok0 + 8 * RF_TOKEN;
    // ---- S^T per scale tile and of RoPE; the keys' tile scales
    float st[4][NR / 2], sr[NR / 2];
    uint4 r[2] = {};  // (set by the issue call before scale_max runs; zeroed for the compiler's flow check)
    const int key0 = blk * PAGE + w4 * 16 + gq;
    // RF_P_E4M3, while S's wgmmas run: the warp's largest live scale of each tile (0 past the length, where the bytes
    // are NaN; compared as unsigned words: the order of non-negative floats) into sSmx
    auto scale_max = [&]() {
      if constexpr (PM == RF_P_E4M3) {
        const uint32_t u[2][4] = {{r[0].x, r[0].y, r[0].z, r[0].w}, {r[1].x, r[1].y, r[1].z, r[1].w}};
        uint32_t tm[4];
#pragma unroll
        for (int tl = 0; tl < 4; ++tl)
          tm[tl] = __reduce_max_sync(0xffffffffu, max(key0 < w.L ? u[0][tl] : 0u, key0 + 8 < w.L ? u[1][tl] : 0u));
        if (lane == 0) *reinterpret_cast<uint4*>(c.sSmx + (par * 4 + w4) * 4) = make_uint4(tm[0], tm[1], tm[2], tm[3]);
      }
    };
    if constexpr (Q8) rf_issue_s8<NR>(tok0, tok1, cq, dq, st, sr, r, scale_max);
    else rf_issue_s<NR>(tok0, tok1, cq, dq, st, sr, r, scale_max);
    const float sc[2][4] = {{__uint_as_float(r[0].x), __uint_as_float(r[0].y), __uint_as_float(r[0].z), __uint_as_float(r[0].w)},
                            {__uint_as_float(r[1].x), __uint_as_float(r[1].y), __uint_as_float(r[1].z), __uint_as_float(r[1].w)}};
    // ---- S in the exp2 domain, keys past a column's limit masked, column max over the 64 keys
    float sacc[NR / 2], mx[NQ];
#pragma unroll
    for (int k = 0; k < NQ; ++k) mx[k] = NEG_INF;
#pragma unroll
    for (int i = 0; i < NR / 2; ++i) {
      const int k = ((i >> 2) << 1) | (i & 1), h = (i >> 1) & 1;
      const float v = (st[0][i] * sc[h][0] + st[1][i] * sc[h][1] + st[2][i] * sc[h][2] + st[3][i] * sc[h][3]) * qs_log2[k] +
                      sr[i] * scale_log2;
      sacc[i] = key0 + 8 * h < lim[k] ? v : NEG_INF;  // (NaN bytes past the length: a select, not a product)
      mx[k] = fmaxf(mx[k], sacc[i]);
    }
    mbar_arrive(c.raw_empty(s));  // K, RoPE and the scales of this page are used
    float* smx = c.sMax + par * 4 * NR;
    column_max_to_smem<NR>(mx, smx, w4, gq, cq);
    bar_sync(RF_BAR_SMAX, 128);
    uint32_t sfield[4];  // RF_P_E4M3: sigma of each tile, the least power of two >= its largest live scale
    float fac[2][4];     // RF_P_E4M3: the keys' live scales over sigma
    if constexpr (PM == RF_P_E4M3) {
      uint4 m4 = *reinterpret_cast<const uint4*>(c.sSmx + par * 16);
#pragma unroll
      for (int wv = 1; wv < 4; ++wv) {
        const uint4 v = *reinterpret_cast<const uint4*>(c.sSmx + (par * 4 + wv) * 4);
        m4 = make_uint4(max(m4.x, v.x), max(m4.y, v.y), max(m4.z, v.z), max(m4.w, v.w));
      }
      sfield[0] = pow2_field_ceil(__uint_as_float(m4.x)), sfield[1] = pow2_field_ceil(__uint_as_float(m4.y));
      sfield[2] = pow2_field_ceil(__uint_as_float(m4.z)), sfield[3] = pow2_field_ceil(__uint_as_float(m4.w));
#pragma unroll
      for (int tl = 0; tl < 4; ++tl) {
        const float inv_sig = pow2_field_inverse(sfield[tl]);
        fac[0][tl] = key0 < w.L ? sc[0][tl] * inv_sig : 0.f, fac[1][tl] = key0 + 8 < w.L ? sc[1][tl] * inv_sig : 0.f;
      }
    }
    float al[NQ], muse[NQ];
#pragma unroll
    for (int k = 0; k < NQ; ++k) {
      const int n = rf_col(k, cq);
      const float m4 = fmaxf(fmaxf(smx[n], smx[NR + n]), fmaxf(smx[2 * NR + n], smx[3 * NR + n]));
      const float mn = m4 > mrow[k] + RF_MAX_SLACK ? m4 : mrow[k];  // (-inf + slack = -inf)
      muse[k] = mn == NEG_INF ? 0.f : mn;
      al[k] = exp2_ftz(mrow[k] - muse[k]);
      mrow[k] = mn;
      lrow[k] *= al[k];
    }
    // ---- P^T[n][key] into the planes of parity par, once WG1 is done with page it - 2
    mbar_wait(c.p_empty(par), ((it >> 1) & 1) ^ 1);
    const uint32_t ph = c.plane(par, 0), pl = c.plane(par, 1);
    if constexpr (PM == RF_P_E4M3) {
      // tile tl's plane: bytes 64 (tl & 1).. of the rows of plane(par, tl >> 1); its k-step ks (keys 32ks..) at
      // + 32ks, and in it key 32ks + 8(2h + o) + 2c + e at byte 16h + 4c + 2e + o: this thread's keys 16 w4 + gq
      // (o = 0) and + 8 (o = 1) are the two bytes at 16 w4 + 2 gq, so one 16-bit store per tile and column
#pragma unroll
      for (int k = 0; k < NQ; ++k) {
        const int i0 = ((k >> 1) << 2) | (k & 1);
        const float p0 = exp2_ftz(sacc[i0] - muse[k]), p1 = exp2_ftz(sacc[i0 + 2] - muse[k]);
        lrow[k] += p0 + p1;
#pragma unroll
        for (int tl = 0; tl < 4; ++tl) {
          const uint16_t v = __nv_cvt_float2_to_fp8x2(make_float2(p0 * fac[0][tl], p1 * fac[1][tl]), __NV_SATFINITE, __NV_E4M3);
          sts16(c.plane(par, tl >> 1) + swz128(rf_col(k, cq), 32 * (tl & 1) + 8 * w4 + gq), v);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < NR / 2; ++i) {
        const int k = ((i >> 2) << 1) | (i & 1), h = (i >> 1) & 1;
        const float p = exp2_ftz(sacc[i] - muse[k]);
        lrow[k] += p;
        const uint32_t off = swz128(rf_col(k, cq), w4 * 16 + gq + 8 * h);
        const __half hp = __float2half_rn(p);
        sts16(ph + off, __half_as_ushort(hp));
        if (PM == RF_P_F16LO) sts16(pl + off, __half_as_ushort(__float2half_rn(p - __half2float(hp))));
      }
    }
    if (w4 == 0 && gq == 0) {
#pragma unroll
      for (int k = 0; k < NQ; ++k) c.sAlpha[par * NR + rf_col(k, cq)] = al[k];
      if (PM == RF_P_E4M3 && cq == 0) {
#pragma unroll
        for (int tl = 0; tl < 4; ++tl) c.sSig[par * 4 + tl] = __uint_as_float(sfield[tl]);
      }
    }
    if (blk == w.kend - 1) {  // the request's row sums: lse here, 1/l for WG1's epilogue
      float* sl = c.sL + (rq & 1) * 4 * NR;
#pragma unroll
      for (int k = 0; k < NQ; ++k) {
        lrow[k] += __shfl_xor_sync(0xffffffffu, lrow[k], 4);
        lrow[k] += __shfl_xor_sync(0xffffffffu, lrow[k], 8);
        lrow[k] += __shfl_xor_sync(0xffffffffu, lrow[k], 16);
        if (gq == 0) sl[w4 * NR + rf_col(k, cq)] = lrow[k];
      }
      bar_sync(RF_BAR_SL, 128);
      if (w4 == 0 && gq == 0) {
        float l[NQ];
#pragma unroll
        for (int k = 0; k < NQ; ++k) {
          const int n = rf_col(k, cq);
          l[k] = sl[n] + sl[NR + n] + sl[2 * NR + n] + sl[3 * NR + n];
          c.sInv[(rq & 1) * NR + n] = l[k] > 0.f ? 1.f / l[k] : 0.f;
        }
        rf_write_lse<NR>(a, c, w, b, cq, mrow, l);
      }
    }
    fence_async_smem();  // P^T -> the async proxy (WG1's wgmma)
    mbar_arrive(c.p_full(par));
  }
}

// ---------------------------------------------------------------- WG1: V^T P^T (t = 0..127)
// V^T's A fragments of k-step ks for the m-tiles 2q, 2q + 1 of words q of x (columns d0 + 4q.. of the keys
// 16ks + 2cq + {0, 1, 8, 9}), times the keys' scale / sigma (fac: keys 0-1, then 8-9)
template <int NW>
__device__ __forceinline__ void rf_convert_v(const uint32_t (&x)[4][NW], const uint32_t (&fac)[2], uint32_t (&f)[2 * NW][4]) {
#pragma unroll
  for (int p2 = 0; p2 < 2; ++p2)
#pragma unroll
    for (int q = 0; q < NW; ++q) {
      const uint32_t lo = prmt(x[2 * p2][q], x[2 * p2 + 1][q], 0x5140), hi = prmt(x[2 * p2][q], x[2 * p2 + 1][q], 0x7362);
      f[2 * q][2 * p2] = hmul2(f16x2_of_e4m3x2<0>(lo), fac[p2]);
      f[2 * q][2 * p2 + 1] = hmul2(f16x2_of_e4m3x2<1>(lo), fac[p2]);
      f[2 * q + 1][2 * p2] = hmul2(f16x2_of_e4m3x2<0>(hi), fac[p2]);
      f[2 * q + 1][2 * p2 + 1] = hmul2(f16x2_of_e4m3x2<1>(hi), fac[p2]);
    }
}

template <int NR, bool LO>
__device__ __forceinline__ void rf_v_request(const DecodeArgs& a, const RfCta<NR>& c, const Work& w, int b, int t,
                                             int& it, int rq) {
  constexpr int NQ = NR / 4, SLOTS = RfLayout<NR>::SLOTS;
  const int w4 = t >> 5, lane = t & 31, gq = lane >> 2, cq = lane & 3;
  const int d0 = 128 * w4 + 16 * gq;  // m-tile mt rows gq / gq + 8 = value columns d0 + 2mt / d0 + 2mt + 1
  float o[8][NR / 2];
#pragma unroll
  for (int mt = 0; mt < 8; ++mt)
#pragma unroll
    for (int i = 0; i < NR / 2; ++i) o[mt][i] = 0.f;
  float sig = 0.f, inv[NQ];
#pragma unroll
  for (int k = 0; k < NQ; ++k) inv[k] = 0.f;
  for (int blk = w.kbeg; blk < w.kend; ++blk, ++it) {
    const int s = it % SLOTS, par = it & 1, valid = w.L - blk * PAGE;
    mbar_wait(c.raw_full(s), (it / SLOTS) & 1);
    const uint32_t pg = c.uRaw + s * RF_PAGE;
    // keys of k-step ks and fragment pair u: 16ks + 2cq + (u & 1) + 8(u >> 1); their scales of tile w4 (0 past
    // the length, as their bytes: NaN x 0 would stay NaN)
    float sc[4][4];
    float mx = 0.f;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int key = 16 * ks + 2 * cq + (u & 1) + 8 * (u >> 1);
        sc[ks][u] = key < valid ? __uint_as_float(lds32u(pg + key * RF_TOKEN + D_V + 4 * w4)) : 0.f;
        mx = fmaxf(mx, sc[ks][u]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const uint32_t sfield = pow2_field_ceil(mx);  // sigma of this page and tile
    const float inv_sig = pow2_field_inverse(sfield);
    uint32_t fac[4][2];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int p2 = 0; p2 < 2; ++p2) fac[ks][p2] = f16x2(sc[ks][2 * p2] * inv_sig, sc[ks][2 * p2 + 1] * inv_sig);
    // the 4 keys' words [wq, wq + NW) of k-step ks (zeros past the length)
    auto load = [&](int ks, int wq, auto& x) {
      constexpr int NW = sizeof(x[0]) / 4;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int key = 16 * ks + 2 * cq + (u & 1) + 8 * (u >> 1);
        if constexpr (NW == 4) {
          const uint4 v = key < valid ? lds128(pg + key * RF_TOKEN + d0) : make_uint4(0, 0, 0, 0);
          x[u][0] = v.x, x[u][1] = v.y, x[u][2] = v.z, x[u][3] = v.w;
        } else {
          const uint2 v = key < valid ? lds64(pg + key * RF_TOKEN + d0 + 4 * wq) : make_uint2(0, 0);
          x[u][0] = v.x, x[u][1] = v.y;
        }
      }
    };
    // O^T's rescale for this page (alpha of the rows, the ratio of sigmas), once P^T is there
    auto wait_p = [&]() {
      mbar_wait(c.p_full(par), (it >> 1) & 1);
      float al[NQ];
#pragma unroll
      for (int k = 0; k < NQ; ++k) al[k] = c.sAlpha[par * NR + rf_col(k, cq)];
      const float rho = sig > 0.f ? sig * inv_sig : 1.f;  // O^T was in units of the previous page's sigma
      sig = __uint_as_float(sfield);
      if (blk == w.kend - 1) {
#pragma unroll
        for (int k = 0; k < NQ; ++k) inv[k] = c.sInv[(rq & 1) * NR + rf_col(k, cq)];
      }
      bool rescale = rho != 1.f;
#pragma unroll
      for (int k = 0; k < NQ; ++k) rescale |= al[k] != 1.f;
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int mt = 0; mt < 8; ++mt)
#pragma unroll
          for (int i = 0; i < NR / 2; ++i) o[mt][i] *= al[((i >> 2) << 1) | (i & 1)] * rho;
      }
    };
    const uint64_t dp = desc_kmajor(c.plane(par, 0)), dl = desc_kmajor(c.plane(par, 1));
    if constexpr (NR == 16) {  // the whole page converted (128 registers), the slot released before P^T is waited
      uint32_t av[4][8][4];  // [k-step][m-tile][fragment register]
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        uint32_t x[4][4];
        load(ks, 0, x);
        rf_convert_v<4>(x, fac[ks], av[ks]);
      }
      mbar_arrive(c.raw_empty(s));  // this page's V bytes and scales are used
      wait_p();
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) fence_regs(o[mt]);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) fence_u32(av[ks]);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int mt = 0; mt < 8; ++mt) {
          wgmma_rs<NR, true>(o[mt], av[ks][mt], dp + ks * 2);
          if (LO) wgmma_rs<NR, true>(o[mt], av[ks][mt], dl + ks * 2);
        }
      wgmma_commit();
    } else {  // batches of half a k-step (4 m-tiles, 16 registers), two in flight; the slot released after the last
      uint32_t av[2][4][4];
      auto convert = [&](int bt) {
        uint32_t x[4][2];
        load(bt >> 1, 2 * (bt & 1), x);
        rf_convert_v<2>(x, fac[bt >> 1], av[bt & 1]);
      };
      auto issue = [&](int bt) {
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          wgmma_rs<NR, true>(o[4 * (bt & 1) + mt], av[bt & 1][mt], dp + (bt >> 1) * 2);
          if (LO) wgmma_rs<NR, true>(o[4 * (bt & 1) + mt], av[bt & 1][mt], dl + (bt >> 1) * 2);
        }
        wgmma_commit();
      };
      convert(0);
      convert(1);
      wait_p();
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) fence_regs(o[mt]);
      fence_u32(av[0]);
      fence_u32(av[1]);
      wgmma_fence();
      issue(0);
      issue(1);
#pragma unroll
      for (int bt = 2; bt < 8; ++bt) {
        wgmma_wait1();  // batch bt - 2 has read this buffer
        convert(bt);
        if (bt == 7) mbar_arrive(c.raw_empty(s));  // this page's V bytes are used
        fence_u32(av[bt & 1]);
        wgmma_fence();
        issue(bt);
      }
    }
    wgmma_wait0();
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) fence_regs(o[mt]);
    mbar_arrive(c.p_empty(par));
  }
  // ---- out (bf16) or the split partial (fp32): 16 contiguous columns per query row
#pragma unroll
  for (int k = 0; k < NQ; ++k) {
    const int n = rf_col(k, cq);
    if (n >= c.m) continue;
    const float f = sig * inv[k];
    float v[16];
#pragma unroll
    for (int mt = 0; mt < 8; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) v[2 * mt + h] = o[mt][(k >> 1) * 4 + 2 * h + (k & 1)] * f;
    if (!w.split) {
      uint4* dst = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(a.out) + ((int64_t)b * c.m + n) * D_V + d0);
      dst[0] = make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
      dst[1] = make_uint4(pack_bf16(v[8], v[9]), pack_bf16(v[10], v[11]), pack_bf16(v[12], v[13]), pack_bf16(v[14], v[15]));
    } else {
      float4* dst = reinterpret_cast<float4*>(a.oacc + ((int64_t)w.g * c.m + n) * D_V + d0);
#pragma unroll
      for (int j = 0; j < 4; ++j) dst[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
    }
  }
}

// RF_P_E4M3 (16-row tile): O^T += V^T P^T by e4m3 wgmma m64n16k32 with V's raw bytes as the A operand; the keys'
// scales over sigma are in P^T (rf_s_request), so no conversion and no scale product here. m-tile mt's 64 rows are
// value columns of scale tile mt >> 1: lane (gq, cq) of warp w4 owns the columns 128 tl + 4 (8 w4 + gq) + 0..3,
// rows gq / gq + 8 of m-tile 2 tl (+0 / +1) and of 2 tl + 1 (+2 / +3). Its A registers of k-step ks (keys 32 ks..)
// are 4 x 4 byte transposes of one word of those columns from each of 8 keys: k = 16h + 4cq + 2e + o holds key
// 32 ks + 8 (2h + o) + 2 cq + e (keys 2 cq + e mod 8 put a warp's 32 words in distinct banks). O^T is in units of
// each tile's sigma (WG0's, in sSig), rescaled by their ratio between pages (exact) with alpha.
template <int NR>
__device__ __forceinline__ void rf_v_request_e4m3(const DecodeArgs& a, const RfCta<NR>& c, const Work& w, int b, int t,
                                                  int& it, int rq) {
  static_assert(NR == 16, "e4m3 P^T: the 16-row tile only");
  constexpr int NQ = NR / 4, SLOTS = RfLayout<NR>::SLOTS;
  const int w4 = t >> 5, lane = t & 31, gq = lane >> 2, cq = lane & 3;
  const int col0 = 4 * (8 * w4 + gq);  // + 128 tl
  float o[8][NR / 2];
#pragma unroll
  for (int mt = 0; mt < 8; ++mt)
#pragma unroll
    for (int i = 0; i < NR / 2; ++i) o[mt][i] = 0.f;
  float sig[4] = {0.f, 0.f, 0.f, 0.f}, inv[NQ];
#pragma unroll
  for (int k = 0; k < NQ; ++k) inv[k] = 0.f;
  for (int blk = w.kbeg; blk < w.kend; ++blk, ++it) {
    const int s = it % SLOTS, par = it & 1, valid = w.L - blk * PAGE;
    mbar_wait(c.raw_full(s), (it / SLOTS) & 1);
    const uint32_t pg = c.uRaw + s * RF_PAGE + col0;
    uint32_t av[2][8][4];  // [k-step][m-tile][fragment register]
    auto load = [&](auto masked) {  // (a full page without the key tests)
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
#pragma unroll
        for (int tl = 0; tl < 4; ++tl)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t x[4];  // byte i of the fragment word: key i (zero past the length, where the bytes are NaN)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int key = 32 * ks + 8 * (2 * h + (i & 1)) + 2 * cq + (i >> 1);
              const uint32_t addr = pg + key * RF_TOKEN + 128 * tl;
              if constexpr (decltype(masked)::value) x[i] = key < valid ? lds32u(addr) : 0u;
              else x[i] = lds32u(addr);
            }
            const uint32_t t0 = prmt(x[0], x[1], 0x5140), t1 = prmt(x[0], x[1], 0x7362);
            const uint32_t t2 = prmt(x[2], x[3], 0x5140), t3 = prmt(x[2], x[3], 0x7362);
            av[ks][2 * tl][2 * h] = prmt(t0, t2, 0x5410), av[ks][2 * tl][2 * h + 1] = prmt(t0, t2, 0x7632);
            av[ks][2 * tl + 1][2 * h] = prmt(t1, t3, 0x5410), av[ks][2 * tl + 1][2 * h + 1] = prmt(t1, t3, 0x7632);
          }
    };
    if (valid >= PAGE) load(std::false_type{});
    else load(std::true_type{});
    mbar_arrive(c.raw_empty(s));  // this page's V bytes are used
    mbar_wait(c.p_full(par), (it >> 1) & 1);
    float al[NQ], rho[4];
    bool rescale = false;
#pragma unroll
    for (int k = 0; k < NQ; ++k) al[k] = c.sAlpha[par * NR + rf_col(k, cq)], rescale |= al[k] != 1.f;
#pragma unroll
    for (int tl = 0; tl < 4; ++tl) {
      const float sg = c.sSig[par * 4 + tl];  // a power of two: 1 / sg and the ratio are exact
      rho[tl] = sig[tl] > 0.f ? sig[tl] * pow2_field_inverse(__float_as_uint(sg)) : 1.f;
      sig[tl] = sg;
      rescale |= rho[tl] != 1.f;
    }
    if (blk == w.kend - 1) {
#pragma unroll
      for (int k = 0; k < NQ; ++k) inv[k] = c.sInv[(rq & 1) * NR + rf_col(k, cq)];
    }
    // the page's products into fresh accumulators (FP8 wgmma keeps ~13 mantissa bits of its sums, SageAttention2's
    // finding: O^T itself stays in fp32), added to O^T once read: tiles 0-1 and 2-3 in two groups
    float op[8][NR / 2];
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) fence_regs(op[mt]);
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) fence_u32(av[ks]);
    wgmma_fence();
    const uint64_t dp0 = desc_kmajor(c.plane(par, 0)), dp1 = desc_kmajor(c.plane(par, 1));
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int mt = 4 * hf + j;
        const uint64_t d = (hf ? dp1 : dp0) + 4 * (j >> 1);
        wgmma_rs_e4m3<NR, 0>(op[mt], av[0][mt], d);
        wgmma_rs_e4m3<NR>(op[mt], av[1][mt], d + 2);
      }
      wgmma_commit();
    }
    const bool any_rescale = __any_sync(0xffffffffu, rescale);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      if (hf == 0) wgmma_wait1();
      else wgmma_wait0();
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int mt = 4 * hf + j;
        fence_regs(op[mt]);
        if (any_rescale) {
#pragma unroll
          for (int i = 0; i < NR / 2; ++i) o[mt][i] = fmaf(o[mt][i], al[((i >> 2) << 1) | (i & 1)] * rho[mt >> 1], op[mt][i]);
        } else {
#pragma unroll
          for (int i = 0; i < NR / 2; ++i) o[mt][i] += op[mt][i];
        }
      }
    }
    mbar_arrive(c.p_empty(par));
  }
  // ---- out (bf16) or the split partial (fp32): 4 contiguous columns per tile and query row
#pragma unroll
  for (int k = 0; k < NQ; ++k) {
    const int n = rf_col(k, cq), i0 = ((k >> 1) << 2) | (k & 1);
    if (n >= c.m) continue;
#pragma unroll
    for (int tl = 0; tl < 4; ++tl) {
      const float f = sig[tl] * inv[k];
      const float v0 = o[2 * tl][i0] * f, v1 = o[2 * tl][i0 + 2] * f, v2 = o[2 * tl + 1][i0] * f, v3 = o[2 * tl + 1][i0 + 2] * f;
      const int64_t col = 128 * tl + col0;
      if (!w.split)
        *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(a.out) + ((int64_t)b * c.m + n) * D_V + col) =
            make_uint2(pack_bf16(v0, v1), pack_bf16(v2, v3));
      else
        *reinterpret_cast<float4*>(a.oacc + ((int64_t)w.g * c.m + n) * D_V + col) = make_float4(v0, v1, v2, v3);
    }
  }
}

template <int NR, bool Q8, bool PV8>
__global__ void __launch_bounds__(RF_THREADS, 1)
    mla_decode_swapab_rf_kernel(const __grid_constant__ DecodeArgs a) {
  using L = RfLayout<NR>;
  constexpr int NQ = NR / 4;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023) & ~1023u;
  RfCta<NR> c;
  c.uRaw = base, c.uQF = base + L::OFF_QF, c.uP = base + L::OFF_P, c.uBar = base + L::OFF_MISC;
  c.sMax = reinterpret_cast<float*>(smem_raw + (base - raw) + L::OFF_MISC + 128);
  c.sL = c.sMax + 8 * NR, c.sAlpha = c.sL + 8 * NR, c.sInv = c.sAlpha + 2 * NR, c.sQred = c.sInv + 2 * NR, c.sQs = c.sQred + 4;
  c.sSmx = c.sQs + NR, c.sSig = c.sSmx + 32;  // (16-byte aligned: 21 NR + 4 floats in)
  c.m = a.s_q * a.h_q;
  if (!load_part(a.meta, a.batch, c)) return;
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::SLOTS; ++s) mbar_init(c.raw_full(s), 1), mbar_init(c.raw_empty(s), 256);
    for (int s = 0; s < 2; ++s) mbar_init(c.p_full(s), 128), mbar_init(c.p_empty(s), 128);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    fence_async_smem();
  }
  __syncthreads();
  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  if (wg == 2) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(RF_PRODUCER_REGS) : "memory");
    if (t == 0) rf_producer<NR>(a, c);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(RF_CONSUMER_REGS) : "memory");
  int it = 0, rq = 0;
  for (int b = c.b0; b <= c.last && b < a.batch; ++b) {
    const Work w = request_work(a, b, c.b0, c.k0, c.b1, c.k1, c.first);
    if (w.split && w.g >= a.batch + a.parts) break;
    const bool lo = w.L < a.p_bf16_min_keys, has_pages = w.kbeg < w.kend;
    if (wg == 0) {
      if (!has_pages) {  // no key in this part: lse only (WG1 writes the zero output)
        float m0[NQ], l0[NQ];
#pragma unroll
        for (int k = 0; k < NQ; ++k) m0[k] = NEG_INF, l0[k] = 0.f;
        if (t < 4) rf_write_lse<NR>(a, c, w, b, t, m0, l0);
        continue;
      }
      const float qmul = Q8 ? rf_convert_q8<NR>(a, c, b, t) : rf_convert_q<NR>(a, c, b, t);
      if (lo) rf_s_request<NR, RF_P_F16LO, Q8>(a, c, w, b, t, it, rq, qmul);
      else if constexpr (PV8) rf_s_request<NR, RF_P_E4M3, Q8>(a, c, w, b, t, it, rq, qmul);
      else rf_s_request<NR, RF_P_F16, Q8>(a, c, w, b, t, it, rq, qmul);
    } else {
      if (lo) rf_v_request<NR, true>(a, c, w, b, t, it, rq);
      else if constexpr (PV8) rf_v_request_e4m3<NR>(a, c, w, b, t, it, rq);
      else rf_v_request<NR, false>(a, c, w, b, t, it, rq);
    }
    rq += has_pages;
  }
}

template <int NR>
int launch_rf(const DecodeArgs& a, void* stream) {
  constexpr int SMEM = RfLayout<NR>::SMEM;
  // FLASHMLA_FP8_PV=1: e4m3 P^T in the 16-row tile (the 32-row one keeps f16 P^T)
  const bool pv8 = NR == 16 && a.fp8_pv;
  auto kernel = a.fp8_q ? (pv8 ? mla_decode_swapab_rf_kernel<NR, true, NR == 16> : mla_decode_swapab_rf_kernel<NR, true, false>)
                        : (pv8 ? mla_decode_swapab_rf_kernel<NR, false, NR == 16> : mla_decode_swapab_rf_kernel<NR, false, false>);
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  if (e != cudaSuccess) return e;
  kernel<<<dim3(1, a.parts), RF_THREADS, SMEM, static_cast<cudaStream_t>(stream)>>>(a);
  return cudaGetLastError();
}

}  // namespace

int launch_mla_decode_swapab_rf(const DecodeArgs& a, void* stream) {
  // FP8 cache, 1..32 rows (16- or 32-row instantiation), pages back to back, 16-byte aligned pointers; otherwise -1
  const int m = a.s_q * a.h_q;
  if (!a.is_fp8 || m < 1 || m > 32 || a.kcache_block_stride != RF_PAGE ||
      (reinterpret_cast<uintptr_t>(a.kcache) | reinterpret_cast<uintptr_t>(a.q)) % 16 != 0)
    return -1;
  return m <= 16 ? launch_rf<16>(a, stream) : launch_rf<32>(a, stream);
}

}  // namespace flashmla
