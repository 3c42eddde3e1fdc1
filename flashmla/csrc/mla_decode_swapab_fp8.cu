// MLA decode, sm_90a, few query rows: FP8 cache, and BF16 (below) (auto or FLASHMLA_KERNEL=swapab;
// s_q * h_q <= 32, h_kv = 1; <= 16 under FLASHMLA_SWAPAB_MAX_ROWS=16).
// Swap-AB: the page's 64 keys are the wgmma M dimension and the query rows the N dimension (NR), so
// 16 rows cost 16 columns of tensor work instead of a 64-row tile padded from 16 (the FP8 wgmma
// kernel). Same DecodeArgs, metadata, split partials, lse and combine kernel as the other kernels.
// Two instantiations, NR = 16 (1..16 rows) and NR = 32 (17..32 rows): m64nNRk16 for S^T and O^T, a Q
// tile of NR rows, P^T [NR x 64], NR / 4 softmax row columns per thread, NR / 2 fp32 per fragment.
// The text below describes NR = 16; NR = 32 differs in: 384 threads (one dequantiser warpgroup, WG0,
// for all 4 chunks; setmaxnreg: WG2 to 40 registers, the consumer WG1 to 240 for its 128 O^T
// accumulators, the dequantiser keeps 168), a 36 KiB Q tile, 4 + 4 KiB P^T, sMax / sL [2][4][32],
// and a raw ring of 3 chunk slots instead of 4 (227,456 bytes of shared memory in all).
//
// One CTA = one scheduler part, 512 threads (NR = 16; 128 registers each at launch):
//   WG2: warp 8 lane 0 is the producer; the warpgroup drops to 40 registers, the consumer takes them.
//   warp 8 (producer, one thread): TMA of the request's 16 Q rows (once per request, after its first
//     page's chunks; tensor map with a 64 x 16 box, 128B swizzle, 9 slabs of 2 KiB; q_full: expect_tx
//     + bytes, q_empty: 128 consumer arrivals after the request's last S) and cp.async.bulk of the raw FP8 page in 4
//     chunks of 16 tokens (10,496 contiguous bytes each) into a ring of NCH chunk slots
//     (raw_full[c]: expect_tx + bytes; raw_empty[c]: 128 dequantiser arrivals); plus
//     cp.async.bulk.prefetch.L2 of the page a.l2_prefetch_pages ahead (FLASHMLA_L2_PREFETCH; unset:
//     kSwapabL2Prefetch = 2, untuned: the ring holds only 41 KiB of loads in flight per SM).
//   WG0 and WG3 (dequantisers, 128 threads each: WG0 chunks 0 and 2 of every page, WG3 chunks 1 and 3;
//     one dequantiser warp per SM sub-partition left most of its cycles to shared-memory latency,
//     Nsight Compute, session 15): per page, wait empty[s] of the bf16 stage, then per own chunk
//     raw_full -> NoPE e4m3 x fp32 scale (one per 128 columns), rounded once to bf16 (as
//     dequantize_kvcache does), RoPE bf16 copied; 128B-swizzled K-major rows (the layout TMA gives
//     the BF16 kernels); token rows past the request's length written as zeros; arrive raw_empty.
//     After its chunks: fence.proxy.async, arrive full[s] (128 arrivals each, 256 in all).
//   WG1 (consumer, 128 threads):
//     S^T[64 keys x 16 rows] = K[64 x 576] Q^T: 36 x wgmma m64n16k16 (A = bf16 stage, K-major;
//       B = Q, K-major, N = 16), 8 fp32 per thread (2 keys x 4 rows).
//     softmax over keys (= over M): per row max across lanes (xor 4/8/16) and the 4 warps (sMax, by
//       page parity), online max in the exp2 domain; the row sums stay per-thread partials (every
//       thread rescales its own by the same alpha) and are reduced once in the epilogue.
//     P^T [16 rows x 64 keys] bf16 to shared memory as the K-major B operand of P V (and the lo
//       plane bf16(p - hi) for requests shorter than a.p_bf16_min_keys, as the other kernels).
//     O^T[512 x 16] += V^T P^T: 8 m-tiles x 4 k-steps of m64n16k16 (A = V^T: the stage's first 8
//       slabs read MN-major, trans-a), 64 fp32 accumulators per thread.
//     epilogue: row sums across lanes and warps (sL, by request parity), out / lse or the split
//       partials oacc / lacc.
// Shared memory (214,144 bytes with the 1 KiB alignment slack):
//   [0, 144 KiB) 2 bf16 stages of 9 slabs (64 x 128 B) | 18 KiB Q (9 slabs of 16 rows) |
//   NCH x 10,496 B raw chunk ring (padded to 1 KiB) | 2 KiB P^T hi + 2 KiB P^T lo | 128 B mbarriers
//   | sMax[2][4][16], sL[2][4][16] fp32.
// CPU models: csrc/models/swapab_fp8_model.py (layouts, fragments, protocol; update together).
//
// BF16 cache (BF = true; auto or FLASHMLA_KERNEL=swapab, the same row limits): the same consumer, but the
// producer loads each page by TMA straight into the bf16 stage (9 boxes of 64 rows x 128 B, 128B swizzle,
// as the BF16 wgmma kernel; full[s]: its expect_tx + the bytes), the dequantiser warpgroups hand their
// registers back and exit, and the consumer zeroes the V rows past the request's length in its last page
// (after S, before P V: NaN x 0 would stay NaN), which the dequantisers do for the FP8 cache. The raw ring
// is left unused.
#include "wgmma_common.cuh"

#include <cuda_fp8.h>

namespace flashmla {
namespace {

constexpr int SAB_TOKEN = 656, SAB_PAGE = PAGE * SAB_TOKEN;   // FP8 bytes per token / per page
constexpr int CH_TOK = 16, CH_BYTES = CH_TOK * SAB_TOKEN;       // a raw chunk: 16 tokens, 10,496 B
// Layout of the instantiation for NR query rows (16 or 32: the wgmma N of S^T and O^T). NR = 32
// doubles the Q tile and P^T planes, so its raw ring has 3 chunk slots instead of 4 to fit.
template <int NR>
struct SabLayout {
  static_assert(NR == 16 || NR == 32, "swap-AB rows: 16 or 32");
  static constexpr int NDQ = NR == 16 ? 2 : 1;                    // dequantiser warpgroups
  // raw ring: chunk slots. With two dequantisers the depth is even, so that each slot belongs to one of
  // them: a warpgroup that skipped the other's phases of a slot could pass its parity wait on a phase
  // it skipped and read a chunk still in flight (the CPU protocol model's mutant "odd_ring")
  static constexpr int NCH = NR == 16 ? 4 : 3;
  static_assert(NDQ == 1 || NCH % NDQ == 0, "ring slots shared between dequantisers");
  // 4 warpgroups (NR = 16: dequantiser, consumer, producer, dequantiser) or 3 (NR = 32), with setmaxnreg
  static constexpr int THREADS = 128 * (2 + NDQ);
  static constexpr int QSLAB = NR * 128;                          // Q slab: NR rows x 64 bf16
  static constexpr int OFF_Q = 2 * TILE, OFF_RAW = OFF_Q + NSLAB * QSLAB;
  static constexpr int OFF_P = (OFF_RAW + NCH * CH_BYTES + 1023) & ~1023, OFF_MISC = OFF_P + 2 * QSLAB;
  static constexpr int NBAR = 2 * NCH + 6;  // raw_full[NCH], raw_empty[NCH], full[2], empty[2], q_full, q_empty
  static constexpr int MISC = 128 + 2 * 2 * 4 * NR * 4;
  static constexpr int SMEM = OFF_MISC + MISC + 1024;
  static_assert(NBAR * 8 <= 128, "mbarriers overflow their 128 bytes");
  static_assert(SMEM <= 232448, "shared memory over the sm_90 limit");
  static_assert(CH_BYTES % 16 == 0 && OFF_RAW % 16 == 0, "bulk copies need 16-byte sizes and addresses");
};
static_assert(SabLayout<16>::SMEM == 214144 && SabLayout<32>::SMEM == 227456, "layout as documented");
// setmaxnreg: WG2 (producer) gives registers back, WG1 (consumer) takes them, the dequantisers keep
// the launch count (NR = 16: 512 threads, 128 each; NR = 32: 384 threads, 168 each)
constexpr int SAB_PRODUCER_REGS = 40;
template <int NR>
struct SabRegs {
  static constexpr int LAUNCH = NR == 16 ? 128 : 168, CONSUMER = NR == 16 ? 216 : 240;
  static_assert(LAUNCH * SabLayout<NR>::THREADS <= 65536, "launch registers");
  static_assert(LAUNCH - SAB_PRODUCER_REGS >= CONSUMER - LAUNCH, "setmaxnreg pool overdrawn");
};
// named barriers of the consumer warpgroup (0 is __syncthreads)
constexpr int BAR_SMAX = 1, BAR_PT = 2, BAR_SL = 3;

// D[64x16] += A[64x16] B[16x16], bf16 in, fp32 accumulate, A and B from shared memory (descriptors),
// B K-major; TA: A MN-major (transposed), else K-major.
template <int TA>
__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[8], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db), "r"(1), "n"(TA));
}
// D[64x32] += A[64x16] B[16x32]: the same for 32 rows (16 fp32 per thread)
template <int TA>
__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[16], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %19, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(1), "n"(TA));
}
__device__ __forceinline__ void sts128(uint32_t addr, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}
// two e4m3 (16 bits) -> two bf16 of value * sc (e4m3 -> f16 is exact; scaled in fp32, rounded once)
__device__ __forceinline__ uint32_t dq2s(uint32_t two, float sc) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return pack_bf16(f.x * sc, f.y * sc);
}
__device__ __forceinline__ uint16_t bf16_bits(float x) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  return *reinterpret_cast<const uint16_t*>(&h);
}

template <int NR>
struct SabCta : Part {
  static constexpr int NCH = SabLayout<NR>::NCH;
  uint32_t uK, uQ, uRaw, uP, uBar;
  float *sMax, *sL;  // [2][4 warps][NR rows] each
  int m;
  __device__ uint32_t raw_full(int c) const { return uBar + 8 * c; }
  __device__ uint32_t raw_empty(int c) const { return uBar + 8 * (NCH + c); }
  __device__ uint32_t full(int s) const { return uBar + 16 * NCH + 8 * s; }
  __device__ uint32_t empty(int s) const { return uBar + 16 * NCH + 16 + 8 * s; }
  __device__ uint32_t q_full() const { return uBar + 16 * NCH + 32; }
  __device__ uint32_t q_empty() const { return uBar + 16 * NCH + 40; }
};

// ---------------------------------------------------------------- producer (one thread)
// FP8 cache: each page as 4 bulk copies of 16 tokens into the raw chunk ring. BF16 cache (BF): the page by TMA
// into stage it & 1 of the CTA's it-th page, once the consumer released it.
template <int NR, bool BF>
__device__ __forceinline__ void sab_producer(const DecodeArgs& a, const SabCta<NR>& c, const CUtensorMap* tmK,
                                             const CUtensorMap* tmQ) {
  if constexpr (BF) asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmK)) : "memory");
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmQ)) : "memory");
  const uint8_t* kc8 = static_cast<const uint8_t*>(a.kcache);
  // bytes between pages and per page (BF16: pages back to back, as launch_mla_decode_swapab checked)
  const int64_t stride = BF ? (int64_t)TILE : a.kcache_block_stride;
  constexpr uint32_t page_bytes = BF ? TILE : SAB_PAGE;
  int slot = 0, phase = 0, it = 0, qn = 0;
  const uint64_t pol = l2_policy_evict_first();
  for (int b = c.b0; b <= c.last && b < a.batch; ++b) {
    const Work w = request_work(a, b, c.b0, c.k0, c.b1, c.k1, c.first);
    if (w.split && w.g >= a.batch + a.parts) break;
    if (w.kbeg >= w.kend) continue;
    const int* bt = a.block_table + (int64_t)b * a.bt_stride;
    const int pf = a.l2_prefetch_pages;  // FLASHMLA_L2_PREFETCH, or kSwapabL2Prefetch (FP8) / kWgmmaL2Prefetch (launch.h)
    for (int p = w.kbeg + 1; p < min(w.kbeg + pf, w.kend); ++p) prefetch_l2_bulk(kc8 + (int64_t)bt[p] * stride, page_bytes);
    for (int blk = w.kbeg; blk < w.kend; ++blk, ++it) {
      if (pf > 0 && blk + pf < w.kend) prefetch_l2_bulk(kc8 + (int64_t)bt[blk + pf] * stride, page_bytes);
      if constexpr (BF) {
        const int s = it & 1;
        mbar_wait(c.empty(s), ((it >> 1) & 1) ^ 1);  // the consumer is done with page it - 2
        mbar_expect_tx(c.full(s), TILE);
        for (int j = 0; j < NSLAB; ++j) tma_load_2d_hint(c.uK + s * TILE + j * SLAB, tmK, j * 64, bt[blk] * PAGE, c.full(s), pol);
      } else {
        const uint8_t* page = kc8 + (int64_t)bt[blk] * stride;
        for (int q = 0; q < PAGE / CH_TOK; ++q) {
          mbar_wait(c.raw_empty(slot), phase ^ 1);
          mbar_expect_tx(c.raw_full(slot), CH_BYTES);
          bulk_copy_hint(c.uRaw + slot * CH_BYTES, page + q * CH_BYTES, CH_BYTES, c.raw_full(slot), pol);
          if (++slot == SabLayout<NR>::NCH) slot = 0, phase ^= 1;
        }
      }
      // Q after the first page: the FP8 chunks only wait for the dequantiser to free ring slots, so they
      // are in flight while the consumer still runs S on the previous request's last page
      if (blk == w.kbeg) {
        mbar_wait(c.q_empty(), (qn & 1) ^ 1);  // the consumer is done with the previous request's Q
        mbar_expect_tx(c.q_full(), NSLAB * SabLayout<NR>::QSLAB);
        for (int j = 0; j < NSLAB; ++j) tma_load_2d(c.uQ + j * SabLayout<NR>::QSLAB, tmQ, j * 64, b * c.m, c.q_full());
        ++qn;
      }
    }
  }
}

// ---------------------------------------------------------------- dequantiser (WG0 / WG3, t = 0..127)
// NoPE: lane l of warp w takes the 8 fp8 columns from c0 = 8(l & 15) + 256(l >> 4) and the 8 from
// c0 + 128, of tokens w + 4i (i = 0..3) of each chunk: two 8-byte loads (each half warp reads 128
// contiguous bytes), stored as bf16 to unit l&7 of slab c0/64 and of slab c0/64 + 2 (each quarter warp:
// the 8 units of one 128-byte row). Loads and stores are conflict-free with no per-lane order (Nsight
// Compute, session 15: 16 contiguous columns per lane had needed either per-lane store orders, which the
// compiler split into predicated copies, or 8-byte loads at a 16-byte stride: 2x the shared-memory
// wavefronts either way). The halves lie in scale tiles 2(l >> 4) and 2(l >> 4) + 1: one 8-byte load.
// RoPE: thread t copies 16 bytes (unit t&7) of token t>>3. A chunk's NoPE bytes are loaded before the
// previous chunk is converted, so their latency overlaps that work.
struct SabRaw {
  uint2 lo[4], hi[4];  // columns c0.. and c0 + 128.. of token w + 4i
  uint2 sc[4];         // their scales (tiles c0 / 128 and c0 / 128 + 1)
};
// Dequantiser dq (of NDQ) takes chunks dq, dq + NDQ, ... of every page; chunk q of the CTA's page it is
// the producer's (4 it + q)-th, hence its ring slot and phase.
template <int NR>
__device__ __forceinline__ void sab_dequant(const DecodeArgs& a, const SabCta<NR>& c, int t, int dq) {
  constexpr int NDQ = SabLayout<NR>::NDQ, NCH = SabLayout<NR>::NCH, QN = PAGE / CH_TOK / NDQ;
  const int w4 = t >> 5, l = t & 31;
  const int c0 = 8 * (l & 15) + 256 * (l >> 4);  // this lane's first column (the second half: c0 + 128)
  const int rtk = t >> 3, ru = t & 7;       // RoPE token and unit
  int it = 0;
  auto load = [&](SabRaw& r, int sl) {
    const uint32_t src = c.uRaw + sl * CH_BYTES;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t tok = src + (w4 + 4 * i) * SAB_TOKEN;
      r.lo[i] = lds64(tok + c0);
      r.hi[i] = lds64(tok + c0 + 128);
      r.sc[i] = lds64(tok + D_V + 4 * (c0 >> 7));
    }
  };
  auto wait_load = [&](SabRaw& r, int q) {  // waits for chunk q of page it, loads it; returns its slot
    const unsigned g = 4u * it + q, sl = g % NCH;
    mbar_wait(c.raw_full(sl), (g / NCH) & 1);
    load(r, sl);
    return (int)sl;
  };
  for (int b = c.b0; b <= c.last && b < a.batch; ++b) {
    const Work w = request_work(a, b, c.b0, c.k0, c.b1, c.k1, c.first);
    if (w.split && w.g >= a.batch + a.parts) break;
    for (int blk = w.kbeg; blk < w.kend; ++blk, ++it) {
      const int s = it & 1, valid = w.L - blk * PAGE;
      const uint32_t st = c.uK + s * TILE;
      mbar_wait(c.empty(s), ((it >> 1) & 1) ^ 1);  // the consumer is done with page it-2
      SabRaw cur, nxt;
      int cur_slot = wait_load(cur, dq), nxt_slot = 0;
#pragma unroll
      for (int k = 0; k < QN; ++k) {
        const int q = dq + k * NDQ;
        if (k + 1 < QN) nxt_slot = wait_load(nxt, q + NDQ);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = q * CH_TOK + w4 + 4 * i;
          uint2 f = cur.lo[i], g = cur.hi[i];
          float sf = __uint_as_float(cur.sc[i].x), sg = __uint_as_float(cur.sc[i].y);
          if (row >= valid) f = g = make_uint2(0, 0), sf = sg = 0.f;  // NaN x 0 would stay NaN
          const uint32_t at = st + (c0 >> 6) * SLAB + row * 128 + (((l & 7) ^ (row & 7)) << 4);
          sts128(at, dq2s(f.x & 0xffffu, sf), dq2s(f.x >> 16, sf), dq2s(f.y & 0xffffu, sf), dq2s(f.y >> 16, sf));
          sts128(at + 2 * SLAB, dq2s(g.x & 0xffffu, sg), dq2s(g.x >> 16, sg), dq2s(g.y & 0xffffu, sg),
                 dq2s(g.y >> 16, sg));
        }
        {
          const int row = q * CH_TOK + rtk;
          uint4 rope = lds128(c.uRaw + cur_slot * CH_BYTES + rtk * SAB_TOKEN + D_V + 16 + ru * 16);
          if (row >= valid) rope = make_uint4(0, 0, 0, 0);
          sts128(st + 8 * SLAB + row * 128 + ((ru ^ (row & 7)) << 4), rope.x, rope.y, rope.z, rope.w);
        }
        // our reads of the slot are done (their values are stored). Arriving right after the loads instead
        // raced with the producer's next TMA write on the H200 (BENCHMARKS.md, session 16) unless a
        // fence.proxy.async came first, which cost what the earlier refill gained
        mbar_arrive(c.raw_empty(cur_slot));
        if (k + 1 < QN) cur = nxt, cur_slot = nxt_slot;
      }
      fence_async_smem();  // generic-proxy stores -> visible to wgmma
      mbar_arrive(c.full(s));
    }
  }
}

// ---------------------------------------------------------------- consumer (WG1, t = 0..127)
// Accumulator fragment of m64nNR (NR / 2 per thread, index j*4 + h*2 + e, j < NR / 8): M row
// w*16 + gq + 8h, N column 8j + 2cq + e. S^T: M = key of the page, N = query row. O^T: M = value
// column (+ 64 per m-tile). Each thread holds KC = NR / 4 query-row columns k = 2j + e.
template <int NR, bool LO, bool BF>
__device__ __forceinline__ void sab_request(const DecodeArgs& a, const SabCta<NR>& c, const Work& w, int b, int t,
                                            int& it, int& qn, int& pg, int& rq) {
  constexpr int QSLAB = SabLayout<NR>::QSLAB, NF = NR / 2, KC = NR / 4;
  const int w4 = t >> 5, lane = t & 31, gq = lane >> 2, cq = lane & 3;
  const float scale_log2 = a.softmax_scale * LOG2E;
  float o[8][NF];
#pragma unroll
  for (int mt = 0; mt < 8; ++mt)
#pragma unroll
    for (int i = 0; i < NF; ++i) o[mt][i] = 0.f;
  float mrow[KC], lrow[KC];
  int lim[KC];
#pragma unroll
  for (int k = 0; k < KC; ++k) {  // column k = 2j + e: query row n = 8j + 2cq + e
    const int n = 8 * (k >> 1) + 2 * cq + (k & 1);
    mrow[k] = NEG_INF, lrow[k] = 0.f;
    lim[k] = (a.causal && n < c.m) ? min(w.L, w.L - a.s_q + 1 + n / a.h_q) : w.L;
  }
  const bool has_pages = w.kbeg < w.kend;
  if (has_pages) mbar_wait(c.q_full(), qn & 1);
  qn += has_pages;
  for (int blk = w.kbeg; blk < w.kend; ++blk, ++it, ++pg) {
    const int s = it & 1;
    const uint32_t uKs = c.uK + s * TILE;
    mbar_wait(c.full(s), (it >> 1) & 1);
    // ---- S^T = K Q^T
    float sacc[NF];
#pragma unroll
    for (int i = 0; i < NF; ++i) sacc[i] = 0.f;
    fence_regs(sacc);
    wgmma_fence();
    const uint64_t dk = desc_kmajor(uKs), dq = desc_kmajor(c.uQ);
#pragma unroll
    for (int kk = 0; kk < D_QK / 16; ++kk)
      wgmma_m64n16k16<0>(sacc, dk + (((kk >> 2) * SLAB + (kk & 3) * 32) >> 4),
                         dq + (((kk >> 2) * QSLAB + (kk & 3) * 32) >> 4));
    wgmma_commit();
    wgmma_wait0();
    fence_regs(sacc);
    if (blk == w.kend - 1) mbar_arrive(c.q_empty());
    // ---- mask, scale, column max over the 64 keys
    float mx[KC];
#pragma unroll
    for (int k = 0; k < KC; ++k) mx[k] = NEG_INF;
    const int key0 = blk * PAGE + w4 * 16 + gq;
#pragma unroll
    for (int i = 0; i < NF; ++i) {
      const int k = ((i >> 2) << 1) | (i & 1), h = (i >> 1) & 1;
      const float v = key0 + 8 * h < lim[k] ? sacc[i] * scale_log2 : NEG_INF;
      sacc[i] = v;
      mx[k] = fmaxf(mx[k], v);
    }
    float* smx = c.sMax + (pg & 1) * 4 * NR;
    column_max_to_smem<NR>(mx, smx, w4, gq, cq);
    bar_sync(BAR_SMAX, 128);  // also: every warp is past the previous page's P V (P^T is free)
    // BF16 cache: rows past the length in the V slabs of the request's last page (every warp's S is done;
    // the fence and barrier after P^T publish the zeros to P V)
    if constexpr (BF) {
      if (w.L - blk * PAGE < PAGE) zero_v_tail(uKs, w.L - blk * PAGE, t);
    }
    float al[KC], muse[KC];
#pragma unroll
    for (int j = 0; j < NR / 8; ++j) {
      float2 m4 = *reinterpret_cast<const float2*>(smx + 8 * j + 2 * cq);
#pragma unroll
      for (int ww = 1; ww < 4; ++ww) {
        const float2 x = *reinterpret_cast<const float2*>(smx + ww * NR + 8 * j + 2 * cq);
        m4.x = fmaxf(m4.x, x.x), m4.y = fmaxf(m4.y, x.y);
      }
      mx[2 * j] = m4.x, mx[2 * j + 1] = m4.y;
    }
#pragma unroll
    for (int k = 0; k < KC; ++k) {
      const float mn = fmaxf(mrow[k], mx[k]);
      muse[k] = mn == NEG_INF ? 0.f : mn;
      al[k] = exp2_ftz(mrow[k] - muse[k]);
      mrow[k] = mn;
      lrow[k] *= al[k];
    }
    // ---- P^T[n][key] (bf16 hi, and lo) into the K-major B operand of P V
#pragma unroll
    for (int i = 0; i < NF; ++i) {
      const int k = ((i >> 2) << 1) | (i & 1), h = (i >> 1) & 1;
      const int n = 8 * (i >> 2) + 2 * cq + (i & 1);
      const float p = exp2_ftz(sacc[i] - muse[k]);
      lrow[k] += p;
      const uint32_t off = swz128(n, w4 * 16 + gq + 8 * h);
      const uint16_t hi = bf16_bits(p);
      sts16(c.uP + off, hi);
      if (LO) sts16(c.uP + QSLAB + off, bf16_bits(p - __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(&hi))));
    }
    fence_async_smem();
    bar_sync(BAR_PT, 128);
    // ---- O^T = alpha O^T + V^T P^T
    bool rescale = al[0] != 1.f || al[1] != 1.f || al[2] != 1.f || al[3] != 1.f;
#pragma unroll
    for (int k = 4; k < KC; ++k) rescale = rescale || al[k] != 1.f;
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int mt = 0; mt < 8; ++mt)
#pragma unroll
        for (int i = 0; i < NF; ++i) o[mt][i] *= al[((i >> 2) << 1) | (i & 1)];
    }
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) fence_regs(o[mt]);
    wgmma_fence();
    const uint64_t dv = desc_mnmajor(uKs), dph = desc_kmajor(c.uP), dpl = desc_kmajor(c.uP + QSLAB);
#pragma unroll
    for (int ks = 0; ks < PAGE / 16; ++ks)
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        wgmma_m64n16k16<1>(o[mt], dv + ((mt * SLAB + ks * 2048) >> 4), dph + ks * 2);
        if (LO) wgmma_m64n16k16<1>(o[mt], dv + ((mt * SLAB + ks * 2048) >> 4), dpl + ks * 2);
      }
    wgmma_commit();
    wgmma_wait0();
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) fence_regs(o[mt]);
    mbar_arrive(c.empty(s));
  }

  // ---- epilogue: row sums over lanes and warps, then out / lse (or the split partials)
  float* sl = c.sL + (rq & 1) * 4 * NR;
  ++rq;
#pragma unroll
  for (int k = 0; k < KC; ++k) {
    lrow[k] += __shfl_xor_sync(0xffffffffu, lrow[k], 4);
    lrow[k] += __shfl_xor_sync(0xffffffffu, lrow[k], 8);
    lrow[k] += __shfl_xor_sync(0xffffffffu, lrow[k], 16);
  }
  if (gq == 0) {
#pragma unroll
    for (int j = 0; j < NR / 8; ++j)
      *reinterpret_cast<float2*>(sl + w4 * NR + 8 * j + 2 * cq) = make_float2(lrow[2 * j], lrow[2 * j + 1]);
  }
  bar_sync(BAR_SL, 128);
#pragma unroll
  for (int k = 0; k < KC; ++k) {
    const int n = 8 * (k >> 1) + 2 * cq + (k & 1);
    const float l = sl[n] + sl[NR + n] + sl[2 * NR + n] + sl[3 * NR + n];
    if (n >= c.m) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int idx0 = (k >> 1) * 4 + (k & 1);  // fragment index of (h = 0, this column)
    if (!w.split) {
      __nv_bfloat16* orow = static_cast<__nv_bfloat16*>(a.out) + ((int64_t)b * c.m + n) * D_V + w4 * 16 + gq;
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        orow[mt * 64] = __float2bfloat16_rn(o[mt][idx0] * inv);
        orow[mt * 64 + 8] = __float2bfloat16_rn(o[mt][idx0 + 2] * inv);
      }
    } else {
      float* orow = a.oacc + ((int64_t)w.g * c.m + n) * D_V + w4 * 16 + gq;
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        orow[mt * 64] = o[mt][idx0] * inv;
        orow[mt * 64 + 8] = o[mt][idx0 + 2] * inv;
      }
    }
    if (w4 == 0 && gq == 0) store_lse(a, w, b, c.m, n, mrow[k], l);
  }
}

template <int NR, bool BF>
__global__ void __launch_bounds__(SabLayout<NR>::THREADS, 1)
    mla_decode_swapab_kernel(const __grid_constant__ DecodeArgs a, const __grid_constant__ CUtensorMap tmK,
                             const __grid_constant__ CUtensorMap tmQ) {
  using L = SabLayout<NR>;
  constexpr int NCH = L::NCH;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023) & ~1023u;
  SabCta<NR> c;
  c.uK = base, c.uQ = base + L::OFF_Q, c.uRaw = base + L::OFF_RAW, c.uP = base + L::OFF_P;
  c.uBar = base + L::OFF_MISC;
  c.sMax = reinterpret_cast<float*>(smem_raw + (base - raw) + L::OFF_MISC + 128);
  c.sL = c.sMax + 2 * 4 * NR;
  c.m = a.s_q * a.h_q;
  if (!load_part(a.meta, a.batch, c)) return;
  if (threadIdx.x == 0) {
    for (int i = 0; i < NCH; ++i) {
      mbar_init(c.raw_full(i), 1);
      mbar_init(c.raw_empty(i), 128);
    }
    for (int s = 0; s < 2; ++s) {
      mbar_init(c.full(s), BF ? 1 : 128 * L::NDQ);
      mbar_init(c.empty(s), 128);
    }
    mbar_init(c.q_full(), 1);
    mbar_init(c.q_empty(), 128);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    fence_async_smem();
  }
  __syncthreads();
  const int wg = threadIdx.x >> 7;
  if (wg == 2) {  // warp 8 lane 0 is the producer, warps 9-11 only hand their registers back
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(SAB_PRODUCER_REGS) : "memory");
    if (threadIdx.x == 256) sab_producer<NR, BF>(a, c, &tmK, &tmQ);
    return;
  }
  if (wg != 1) {
    if constexpr (BF) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(SAB_PRODUCER_REGS) : "memory");
    else sab_dequant(a, c, threadIdx.x & 127, wg == 0 ? 0 : 1);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(SabRegs<NR>::CONSUMER) : "memory");
  const int t = threadIdx.x - 128;
  int it = 0, qn = 0, pg = 0, rq = 0;
  for (int b = c.b0; b <= c.last && b < a.batch; ++b) {
    const Work w = request_work(a, b, c.b0, c.k0, c.b1, c.k1, c.first);
    if (w.split && w.g >= a.batch + a.parts) break;
    if (w.L < a.p_bf16_min_keys) sab_request<NR, true, BF>(a, c, w, b, t, it, qn, pg, rq);
    else sab_request<NR, false, BF>(a, c, w, b, t, it, qn, pg, rq);
  }
}

// Builds Q's tensor map (and K's for a BF16 cache) and launches the NR-row instantiation (-1 without
// launching: no TMA).
template <int NR, bool BF>
int launch_swapab(const DecodeArgs& a, int m, void* stream) {
  // Q as rows of 576 bf16, boxes of NR rows x 64 columns, 128B swizzle (rows past the tensor read 0;
  // rows of the next request are finite and only reach the padding columns of S^T and O^T)
  alignas(64) CUtensorMap tmK, tmQ;
  if (!make_map(&tmQ, a.q, D_QK, D_QK * 2, static_cast<uint64_t>(a.batch) * m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 64,
                CU_TENSOR_MAP_SWIZZLE_128B, NR))
    return -1;
  if (BF && !make_map(&tmK, a.kcache, D_QK, D_QK * 2, static_cast<uint64_t>(a.num_blocks) * PAGE)) return -1;
  if (!BF) tmK = tmQ;  // (unused)
  constexpr int smem = SabLayout<NR>::SMEM;
  cudaError_t e =
      cudaFuncSetAttribute(mla_decode_swapab_kernel<NR, BF>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  mla_decode_swapab_kernel<NR, BF><<<dim3(1, a.parts), SabLayout<NR>::THREADS, smem, static_cast<cudaStream_t>(stream)>>>(
      a, tmK, tmQ);
  return cudaGetLastError();
}

}  // namespace

int launch_mla_decode_swapab(const DecodeArgs& a, void* stream, int max_rows) {
  // at most max_rows (32, or 16 under FLASHMLA_SWAPAB_MAX_ROWS=16) query rows, pages back to back (FP8: bulk
  // copies of 16 tokens; BF16: TMA rows of 576), 16-byte aligned pointers; otherwise -1 (the caller runs the
  // default kernel). 1..16 rows run the 16-row instantiation, 17..32 the 32-row one.
  const int m = a.s_q * a.h_q;
  const int64_t page_stride = a.is_fp8 ? (int64_t)SAB_PAGE : (int64_t)PAGE * D_QK;  // (bytes, or bf16 elements)
  if (m > max_rows || m > 32 || m < 1 || a.kcache_block_stride != page_stride ||
      (reinterpret_cast<uintptr_t>(a.kcache) | reinterpret_cast<uintptr_t>(a.q)) % 16 != 0)
    return -1;
  if (a.is_fp8) return m <= 16 ? launch_swapab<16, false>(a, m, stream) : launch_swapab<32, false>(a, m, stream);
  return m <= 16 ? launch_swapab<16, true>(a, m, stream) : launch_swapab<32, true>(a, m, stream);
}

}  // namespace flashmla
