// MLA decode over a paged KV cache, sm_90a: split-KV main kernel + combine kernel.
//
// One CTA (8 warps) = BM query rows (BM = 16, 32 or 64; rows are (s_q index, head) pairs of one
// request, row = i*h_q + h) x one scheduler part (a range of (request, page) positions from
// get_mla_metadata). For each page of 64 tokens:
//   S = Q K^T (BM x 64, K dim 576)   warp (wm, wn) computes rows wm*16.., keys wn*KPW..
//     (KS variant, BM <= 32: the warps split the 36 k-steps instead and sum fp32 partials)
//   online softmax in fp32 (row max shared through shared memory, exp2 domain)
//   O += P V  (BM x 512, V = first 512 columns of K)   warp (wm, wn) owns columns wn*CPW..
//     P enters as two bf16 planes (hi + lo), so P V is accurate to ~2^-16 rather than 2^-9, for
//     requests shorter than a.p_bf16_min_keys; longer ones (whose error of bf16 P the many keys
//     sharing the softmax mass keep under the tolerance) as bf16 alone
// mma.sync m16n8k16 bf16 with fp32 accumulation; operands through ldmatrix from XOR-swizzled shared
// memory; pages streamed with cp.async into two buffers (load page t+1 while computing page t) and
// prefetched into L2 three pages ahead. FP8 pages are staged raw and dequantised in shared memory.
// A request covered by one part is written straight to out/lse; a split request writes fp32
// partials (normalised O and its lse) that the combine kernel merges.
// Measured on an H200 (BENCHMARKS.md): 3.1-3.2 TB/s for 16-row tiles on long contexts, ~200 TFLOPS
// for 64-row tiles; bound by shared-memory traffic and barriers, not HBM (wgmma is the next step).
#include <cuda_fp8.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common.cuh"
#include "launch.h"

namespace flashmla {
namespace {

constexpr int NT = 256;
constexpr int ROWB = D_QK * 2;                 // bytes of one bf16 row in shared memory
constexpr int RCH = ROWB / 16;                 // 16-byte chunks per row (72)
constexpr int KTILE = PAGE * ROWB;             // bytes of one bf16 page (73728)
constexpr int QROWB = D_V * 2;                 // Q rows in shared memory: the 512 NoPE columns
                                               // (the 64 RoPE columns of Q live in registers)
// byte offset of 16-byte chunk `ch` of row `r` in a swizzled tile whose rows are `rowb` bytes
__device__ __forceinline__ uint32_t swz(int r, int ch, int rowb) { return r * rowb + ((ch ^ (r & 7)) << 4); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// bring a whole page into L2 ahead of its cp.async (more bytes in flight than two smem buffers)
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t& r0, uint32_t& r1, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

constexpr int FP8_TOKEN = 656;                 // fp8 token: 512 e4m3 | 4 fp32 scales | 64 bf16 RoPE
constexpr int FP8_CH = FP8_TOKEN / 16;         // 41 chunks
constexpr int FP8_TILE = PAGE * FP8_TOKEN;     // 41984 bytes

template <int WM, bool FP8, bool KS>
struct Cfg {
  static constexpr int BM = 16 * WM;       // query rows per CTA
  static constexpr int WN = 8 / WM;        // warps side by side over keys (S) and columns (O)
  static constexpr int KPW = PAGE / WN;    // keys of S per warp
  static constexpr int NTS = KPW / 8;      // n8 tiles of S per warp
  static constexpr int CPW = D_V / WN;     // output columns per warp
  static constexpr int NTO = CPW / 8;      // n8 tiles of O per warp
  // P is kept as two bf16 planes, hi = bf16(p) and lo = bf16(p - hi), so P V is exact to ~2^-16
  // BF16: two page buffers filled by cp.async. FP8: two raw fp8 staging buffers filled by
  // cp.async and one bf16 page buffer that the CTA dequantises into before the matrix products.
  // KS (K-split, BM <= 32): for S, the 8 warps split the 36 k-steps of the 576-wide dot product
  // instead of the keys, so Q is read from shared memory once per page instead of WN times; the
  // fp32 partial S tiles are summed through shared memory (PART). Q rows then keep all 576 columns.
  static constexpr int QRB = KS ? ROWB : QROWB;
  static constexpr int SMEM_Q = BM * QRB, SMEM_K = FP8 ? KTILE : 2 * KTILE;
  static constexpr int SMEM_STAGE = FP8 ? 2 * FP8_TILE : 0, SMEM_P = 2 * BM * 128;
  static constexpr int PART_LD = 72;       // floats per row of a partial S tile (64 + 8 pad)
  static constexpr int SMEM_PART = KS ? 8 * 16 * PART_LD * 4 : 0;
  static constexpr int SMEM = SMEM_Q + SMEM_K + SMEM_STAGE + SMEM_P + 2 * WN * BM * 4 + SMEM_PART;
};

template <int WM, bool FP8, bool KS>
__global__ void __launch_bounds__(NT, 1) mla_decode_kernel(const DecodeArgs a) {
  using C = Cfg<WM, FP8, KS>;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* sQ = smem;
  uint8_t* sK = sQ + C::SMEM_Q;
  uint8_t* sStage = sK + C::SMEM_K;
  uint8_t* sP = sStage + C::SMEM_STAGE;
  float* sMax = reinterpret_cast<float*>(sP + C::SMEM_P);
  float* sSum = sMax + C::WN * C::BM;
  float* sPart = sSum + C::WN * C::BM;
  const uint32_t uQ = smem_u32(sQ), uK = smem_u32(sK), uP = smem_u32(sP), uPl = uP + C::BM * 128;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % WM, wn = warp / WM;
  const int m = a.s_q * a.h_q;
  const int row_base = blockIdx.x * C::BM;
  const int* meta = a.meta + blockIdx.y * 8;
  const int b0 = meta[0], k0 = meta[1], b1 = meta[2], k1 = meta[3], first = meta[4];
  if (b0 < 0 || b0 >= a.batch || b1 > a.batch || first < 0 || (b0 == b1 && k0 == k1)) return;
  const int last = k1 > 0 ? b1 : b1 - 1;
  const float scale_log2 = a.softmax_scale * LOG2E;
  const __nv_bfloat16* kc = static_cast<const __nv_bfloat16*>(a.kcache);
  const uint8_t* kc8 = static_cast<const uint8_t*>(a.kcache);
  const uint32_t uStage = smem_u32(sStage);

  // the two rows of each lane in the mma C layout
  const int r_loc[2] = {wm * 16 + (lane >> 2), wm * 16 + (lane >> 2) + 8};

  for (int b = b0; b <= last && b < a.batch; ++b) {
    const int nb = min((max(a.seqlens[b], 0) + PAGE - 1) / PAGE, a.max_blocks);
    const int L = min(max(a.seqlens[b], 0), nb * PAGE);
    const int kbeg = b == b0 ? k0 : 0;
    const int kend = min(b == b1 ? k1 : nb, nb);
    const bool split = a.num_splits[b + 1] - a.num_splits[b] > 1;
    const int g = first + (b - b0);
    if (split && g >= a.batch + a.parts) break;  // inconsistent metadata: never write out of bounds
    const int* bt = a.block_table + (int64_t)b * a.bt_stride;
    const bool lo = L < a.p_bf16_min_keys;  // P as hi + lo planes, or bf16 alone for long requests

    int lim[2];  // keys visible to each of the lane's rows
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rg = row_base + r_loc[h];
      lim[h] = (a.causal && rg < m) ? min(L, L - a.s_q + 1 + rg / a.h_q) : L;
    }

    auto load_page = [&](int blk, int buf) {
      const int valid = L - blk * PAGE;  // tokens past it are zero-filled (never read: NaN-safe)
      if constexpr (FP8) {
        const uint8_t* src = kc8 + (int64_t)bt[blk] * a.kcache_block_stride;
        const uint32_t dst = uStage + buf * FP8_TILE;
#pragma unroll 4
        for (int c = tid; c < PAGE * FP8_CH; c += NT) {
          const int r = c / FP8_CH;
          cp_async16(dst + c * 16, src + c * 16, r < valid);
        }
      } else {
        const __nv_bfloat16* src = kc + (int64_t)bt[blk] * a.kcache_block_stride;
        const uint32_t dst = uK + buf * KTILE;
#pragma unroll 6
        for (int c = tid; c < PAGE * RCH; c += NT) {
          const int r = c / RCH, ch = c - r * RCH;
          cp_async16(dst + swz(r, ch, ROWB), src + r * D_QK + ch * 8, r < valid);
        }
      }
    };
    auto prefetch_page = [&](int blk) {
      if (FP8) prefetch_l2(kc8 + (int64_t)bt[blk] * a.kcache_block_stride, FP8_TILE);
      else prefetch_l2(kc + (int64_t)bt[blk] * a.kcache_block_stride, KTILE);
    };
    // FP8: staging buffer -> bf16 page (value = e4m3 * scale of its 128-column tile; RoPE copied)
    auto dequant_page = [&](int buf) {
      const uint8_t* st = sStage + buf * FP8_TILE;
#pragma unroll 2
      for (int it = tid; it < PAGE * 32; it += NT) {
        const int r = it >> 5, c = it & 31;  // token, 16-value chunk of the NoPE part
        const uint4 raw = *reinterpret_cast<const uint4*>(st + r * FP8_TOKEN + c * 16);
        const float sc = *reinterpret_cast<const float*>(st + r * FP8_TOKEN + D_V + (c >> 3) * 4);
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
        uint32_t outw[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(
                static_cast<__nv_fp8x2_storage_t>((w[i] >> (16 * hh)) & 0xffffu), __NV_E4M3);
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
            outw[2 * i + hh] = pack_bf16(f.x * sc, f.y * sc);
          }
        }
        *reinterpret_cast<uint4*>(sK + swz(r, 2 * c, ROWB)) = make_uint4(outw[0], outw[1], outw[2], outw[3]);
        *reinterpret_cast<uint4*>(sK + swz(r, 2 * c + 1, ROWB)) = make_uint4(outw[4], outw[5], outw[6], outw[7]);
      }
      for (int it = tid; it < PAGE * 8; it += NT) {
        const int r = it >> 3, c = it & 7;
        *reinterpret_cast<uint4*>(sK + swz(r, 64 + c, ROWB)) =
            *reinterpret_cast<const uint4*>(st + r * FP8_TOKEN + D_V + 16 + c * 16);
      }
    };

    float o[C::NTO][4];
#pragma unroll
    for (int i = 0; i < C::NTO; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mrow[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.f, 0.f};

    uint32_t qr[4][4];  // A fragments of the RoPE columns 512..575 of this warp's 16 rows
    if (kbeg < kend) {
      const __nv_bfloat16* qb = static_cast<const __nv_bfloat16*>(a.q) + (int64_t)b * m * D_QK;
      constexpr int QC = C::QRB / 16;
      for (int c = tid; c < C::BM * QC; c += NT) {
        const int r = c / QC, ch = c - r * QC;
        const bool v = row_base + r < m;
        cp_async16(uQ + swz(r, ch, C::QRB), qb + (int64_t)(v ? row_base + r : 0) * D_QK + ch * 8, v);
      }
      load_page(kbeg, 0);
      cp_commit();
      if (tid == 0) {
        if (kbeg + 1 < kend) prefetch_page(kbeg + 1);
        if (kbeg + 2 < kend) prefetch_page(kbeg + 2);
      }
#pragma unroll
      for (int kk = 0; kk < (KS ? 0 : 4); ++kk) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = row_base + r_loc[e & 1];
          const int col = D_V + kk * 16 + (lane & 3) * 2 + (e >> 1) * 8;
          qr[kk][e] = r < m ? *reinterpret_cast<const uint32_t*>(qb + (int64_t)r * D_QK + col) : 0u;
        }
      }
    }

    for (int blk = kbeg; blk < kend; ++blk) {
      const int buf = (blk - kbeg) & 1;
      if (blk + 1 < kend) load_page(blk + 1, buf ^ 1);
      cp_commit();
      if (tid == 0 && blk + 3 < kend) prefetch_page(blk + 3);
      cp_wait<1>();
      __syncthreads();
      if constexpr (FP8) {
        dequant_page(buf);
        __syncthreads();
      }
      const uint32_t uKb = FP8 ? uK : uK + buf * KTILE;

      // ---- S = Q K^T for rows wm*16.., keys wn*KPW..
      float s[C::NTS][4];
#pragma unroll
      for (int i = 0; i < C::NTS; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
      if constexpr (KS) {
        float ps[8][4];  // partial S: this warp's k-steps, all 64 keys
#pragma unroll
        for (int i = 0; i < 8; ++i) ps[i][0] = ps[i][1] = ps[i][2] = ps[i][3] = 0.f;
        constexpr int NKS = (D_QK / 16 + C::WN - 1) / C::WN;
#pragma unroll
        for (int i = 0; i < NKS; ++i) {
          const int kk = wn + C::WN * i;
          if (kk < D_QK / 16) {
            uint32_t af[4];
            ldsm_x4(af, uQ + swz(wm * 16 + (lane & 15), kk * 2 + (lane >> 4), ROWB));
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              uint32_t x[4];
              ldsm_x4(x, uKb + swz(j * 16 + ((lane >> 4) << 3) + (lane & 7), kk * 2 + ((lane >> 3) & 1), ROWB));
              mma16816(ps[2 * j], af, x[0], x[1]);
              mma16816(ps[2 * j + 1], af, x[2], x[3]);
            }
          }
        }
        float* mine = sPart + (wm * C::WN + wn) * 16 * C::PART_LD;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            *reinterpret_cast<float2*>(mine + ((lane >> 2) + 8 * h) * C::PART_LD + nt * 8 + (lane & 3) * 2) =
                make_float2(ps[nt][2 * h], ps[nt][2 * h + 1]);
        __syncthreads();
#pragma unroll
        for (int nt = 0; nt < C::NTS; ++nt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float2 acc = make_float2(0.f, 0.f);
#pragma unroll
            for (int w = 0; w < C::WN; ++w) {
              const float2 v = *reinterpret_cast<const float2*>(
                  sPart + ((wm * C::WN + w) * 16 + (lane >> 2) + 8 * h) * C::PART_LD + wn * C::KPW + nt * 8 + (lane & 3) * 2);
              acc.x += v.x;
              acc.y += v.y;
            }
            s[nt][2 * h] = acc.x;
            s[nt][2 * h + 1] = acc.y;
          }
      } else {
      // with few n8 tiles, alternate two accumulator sets to halve the dependent mma chain
      constexpr int NACC = C::NTS <= 2 ? 2 : 1;
      float s2[NACC == 2 ? C::NTS : 1][4];
#pragma unroll
      for (int i = 0; i < (NACC == 2 ? C::NTS : 1); ++i) s2[i][0] = s2[i][1] = s2[i][2] = s2[i][3] = 0.f;
      auto qk_step = [&](const uint32_t (&af)[4], int kk, auto& acc) {
        if constexpr (C::NTS == 1) {
          uint32_t x0, x1;
          ldsm_x2(x0, x1, uKb + swz(wn * C::KPW + (lane & 7), kk * 2 + ((lane >> 3) & 1), ROWB));
          mma16816(acc[0], af, x0, x1);
        } else {
#pragma unroll
          for (int j = 0; j < C::NTS / 2; ++j) {
            uint32_t x[4];
            ldsm_x4(x, uKb + swz(wn * C::KPW + j * 16 + ((lane >> 4) << 3) + (lane & 7),
                                 kk * 2 + ((lane >> 3) & 1), ROWB));
            mma16816(acc[2 * j], af, x[0], x[1]);
            mma16816(acc[2 * j + 1], af, x[2], x[3]);
          }
        }
      };
      if constexpr (NACC == 2) {
#pragma unroll 2
        for (int kk = 0; kk < D_V / 16; kk += 2) {
          uint32_t af[4], ag[4];
          ldsm_x4(af, uQ + swz(wm * 16 + (lane & 15), kk * 2 + (lane >> 4), QROWB));
          ldsm_x4(ag, uQ + swz(wm * 16 + (lane & 15), kk * 2 + 2 + (lane >> 4), QROWB));
          qk_step(af, kk, s);
          qk_step(ag, kk + 1, s2);
        }
        qk_step(qr[0], D_V / 16, s);
        qk_step(qr[1], D_V / 16 + 1, s2);
        qk_step(qr[2], D_V / 16 + 2, s);
        qk_step(qr[3], D_V / 16 + 3, s2);
#pragma unroll
        for (int i = 0; i < C::NTS; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[i][e] += s2[i][e];
      } else {
#pragma unroll 2
        for (int kk = 0; kk < D_V / 16; ++kk) {
          uint32_t af[4];
          ldsm_x4(af, uQ + swz(wm * 16 + (lane & 15), kk * 2 + (lane >> 4), QROWB));
          qk_step(af, kk, s);
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) qk_step(qr[kk], D_V / 16 + kk, s);
      }
      }  // KS

      // ---- mask, scale to the exp2 domain, row max
      const int key0 = blk * PAGE + wn * C::KPW + (lane & 3) * 2;
      float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
      for (int nt = 0; nt < C::NTS; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + nt * 8 + (e & 1);
          const float v = key < lim[e >> 1] ? s[nt][e] * scale_log2 : NEG_INF;
          s[nt][e] = v;
          mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        if ((lane & 3) == 0) sMax[wn * C::BM + r_loc[h]] = mx[h];
      }
      __syncthreads();

      // ---- online softmax update, P (bf16) to shared memory
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mn = mrow[h];
#pragma unroll
        for (int w = 0; w < C::WN; ++w) mn = fmaxf(mn, sMax[w * C::BM + r_loc[h]]);
        const float muse = mn == NEG_INF ? 0.f : mn;
        const float alpha = exp2f(mrow[h] - muse);
        mrow[h] = mn;
        lrow[h] *= alpha;
#pragma unroll
        for (int nt = 0; nt < C::NTO; ++nt) {
          o[nt][2 * h] *= alpha;
          o[nt][2 * h + 1] *= alpha;
        }
#pragma unroll
        for (int nt = 0; nt < C::NTS; ++nt) {
          const float p0 = exp2f(s[nt][2 * h] - muse), p1 = exp2f(s[nt][2 * h + 1] - muse);
          lrow[h] += p0 + p1;
          const int col = wn * C::KPW + nt * 8 + (lane & 3) * 2;
          const int r = r_loc[h];
          const int off = r * 128 + (((col >> 3) ^ (r & 7)) << 4) + (col & 7) * 2;
          const __nv_bfloat162 hi = __floats2bfloat162_rn(p0, p1);
          *reinterpret_cast<__nv_bfloat162*>(sP + off) = hi;
          if (lo)
            *reinterpret_cast<uint32_t*>(sP + C::BM * 128 + off) =
                pack_bf16(p0 - __low2float(hi), p1 - __high2float(hi));
        }
      }
      __syncthreads();

      // ---- O += P V for rows wm*16.., columns wn*CPW..
#pragma unroll
      for (int ks = 0; ks < PAGE / 16; ++ks) {
        uint32_t af[4], al[4];
        ldsm_x4(af, uP + swz(wm * 16 + (lane & 15), ks * 2 + (lane >> 4), 128));
        if (lo) ldsm_x4(al, uPl + swz(wm * 16 + (lane & 15), ks * 2 + (lane >> 4), 128));
#pragma unroll
        for (int j = 0; j < C::NTO / 2; ++j) {
          uint32_t x[4];
          ldsm_x4_t(x, uKb + swz(ks * 16 + ((lane >> 3) & 1) * 8 + (lane & 7),
                                 (wn * C::CPW + j * 16) / 8 + (lane >> 4), ROWB));
          mma16816(o[2 * j], af, x[0], x[1]);
          mma16816(o[2 * j + 1], af, x[2], x[3]);
          if (lo) {
            mma16816(o[2 * j], al, x[0], x[1]);
            mma16816(o[2 * j + 1], al, x[2], x[3]);
          }
        }
      }
      __syncthreads();
    }
    cp_wait<0>();

    // ---- epilogue: total row sums across the WN warps, normalise, write
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lrow[h] += __shfl_xor_sync(0xffffffffu, lrow[h], 1);
      lrow[h] += __shfl_xor_sync(0xffffffffu, lrow[h], 2);
      if ((lane & 3) == 0) sSum[wn * C::BM + r_loc[h]] = lrow[h];
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rg = row_base + r_loc[h];
      if (rg >= m) continue;
      float lt = 0.f;
#pragma unroll
      for (int w = 0; w < C::WN; ++w) lt += sSum[w * C::BM + r_loc[h]];
      const bool empty = !(lt > 0.f);
      const float inv = empty ? 0.f : 1.f / lt;
      const float lse = empty ? (split ? NEG_INF : -NEG_INF) : (mrow[h] + log2f(lt)) * LN2;
      const int col0 = wn * C::CPW + (lane & 3) * 2;
      if (!split) {
        __nv_bfloat16* orow = static_cast<__nv_bfloat16*>(a.out) + ((int64_t)b * m + rg) * D_V;
#pragma unroll
        for (int nt = 0; nt < C::NTO; ++nt)
          *reinterpret_cast<uint32_t*>(orow + col0 + nt * 8) = pack_bf16(o[nt][2 * h] * inv, o[nt][2 * h + 1] * inv);
        if (wn == 0 && (lane & 3) == 0) {
          const int i = rg / a.h_q, hh = rg - i * a.h_q;
          a.lse[(int64_t)b * m + hh * a.s_q + i] = lse;
        }
      } else {
        float* orow = a.oacc + ((int64_t)g * m + rg) * D_V;
#pragma unroll
        for (int nt = 0; nt < C::NTO; ++nt)
          *reinterpret_cast<float2*>(orow + col0 + nt * 8) = make_float2(o[nt][2 * h] * inv, o[nt][2 * h + 1] * inv);
        if (wn == 0 && (lane & 3) == 0) a.lacc[(int64_t)g * m + rg] = lse;
      }
    }
    __syncthreads();
  }
}

// Merge the partials of split requests: COMBINE_ROWS rows of one request per CTA, a warp per row, each
// lane 16 of the 512 columns (4 float4 128 columns apart, so that every load of the warp reads 512
// contiguous bytes). A CTA per row exited at once for unsplit requests but still cost ~6 us per call
// at 64 requests x 128 rows (8192 empty CTAs; H200, session 23).
constexpr int COMBINE_ROWS = 8;
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__global__ void __launch_bounds__(32 * COMBINE_ROWS) mla_combine_kernel(const DecodeArgs a) {
  const int b = blockIdx.y, m = a.s_q * a.h_q;
  const int s0 = a.num_splits[b], n = a.num_splits[b + 1] - s0;
  const int lane = threadIdx.x & 31, rg = blockIdx.x * COMBINE_ROWS + (threadIdx.x >> 5);
  if (n <= 1 || rg >= m) return;
  const float* lse_j = a.lacc + (int64_t)s0 * m + rg;  // split j's lse at lse_j[j * m]
  float mx = NEG_INF;
  for (int j = lane; j < n; j += 32) mx = fmaxf(mx, lse_j[(int64_t)j * m]);
  mx = warp_max(mx);
  float acc[16] = {};
  float sum = 0.f;
  if (mx != NEG_INF) {
    for (int j = lane; j < n; j += 32) sum += expf(lse_j[(int64_t)j * m] - mx);
    sum = warp_sum(sum);
    const float inv = 1.f / sum;
    const float* o_j = a.oacc + ((int64_t)s0 * m + rg) * D_V + lane * 4;  // split j's row at o_j[j * m * D_V]
    for (int j = 0; j < n; ++j) {
      const float w = expf(lse_j[(int64_t)j * m] - mx) * inv;
      if (w == 0.f) continue;  // a split with no key for this row: its partial is not read
      const float* src = o_j + (int64_t)j * m * D_V;
      float4 v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = *reinterpret_cast<const float4*>(src + k * 128);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        acc[4 * k] += w * v[k].x; acc[4 * k + 1] += w * v[k].y; acc[4 * k + 2] += w * v[k].z; acc[4 * k + 3] += w * v[k].w;
      }
    }
  }
  __nv_bfloat16* orow = static_cast<__nv_bfloat16*>(a.out) + ((int64_t)b * m + rg) * D_V + lane * 4;
#pragma unroll
  for (int k = 0; k < 4; ++k)
    *reinterpret_cast<uint2*>(orow + k * 128) =
        make_uint2(pack_bf16(acc[4 * k], acc[4 * k + 1]), pack_bf16(acc[4 * k + 2], acc[4 * k + 3]));
  if (lane == 0) {
    const int i = rg / a.h_q, hh = rg - i * a.h_q;
    a.lse[(int64_t)b * m + hh * a.s_q + i] = mx == NEG_INF ? -NEG_INF : mx + logf(sum);
  }
}

template <int WM, bool FP8, bool KS>
cudaError_t launch(const DecodeArgs& a, cudaStream_t st) {
  using C = Cfg<WM, FP8, KS>;
  static_assert(C::SMEM <= 232448, "shared memory over the sm_90 limit");
  cudaError_t e = cudaFuncSetAttribute(mla_decode_kernel<WM, FP8, KS>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
  if (e != cudaSuccess) return e;
  const int m = a.s_q * a.h_q;
  dim3 grid((m + C::BM - 1) / C::BM, a.parts);
  mla_decode_kernel<WM, FP8, KS><<<grid, NT, C::SMEM, st>>>(a);
  return cudaGetLastError();
}

}  // namespace

bool fp8_kernel_built() { return true; }

static const char* g_last_kernel = "";  // host-side record of the last main kernel launched (tests)
const char* last_kernel() { return g_last_kernel; }

const char* launch_mla_decode(const DecodeArgs& args, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  DecodeArgs a = args;
  const int m = a.s_q * a.h_q;
  // FLASHMLA_KSPLIT=0 selects the key-split S phase for 16/32-row tiles (the K-split is the default)
  const char* env = getenv("FLASHMLA_KSPLIT");
  const bool ks = !(env && env[0] == '0');
  // FLASHMLA_KERNEL: unset or 'auto' runs the swap-AB kernel up to swapab_max_rows() query rows per
  // request (both caches) and above that the warp-specialised wgmma/TMA kernel (mla_decode_wgmma.cu;
  // for the FP8 cache mla_decode_wgmma_fp8.cu from kFp8WgmmaMinRows rows, launch.h); 'default' (the
  // mma.sync kernel below), 'wgmma' or 'swapab' force one. Tensors TMA cannot address always run the
  // kernel below.
  const char* kern = getenv("FLASHMLA_KERNEL");
  const bool auto_pick = !kern || !kern[0] || strcmp(kern, "auto") == 0;
  // 'swapab' runs the swap-AB kernel (mla_decode_swapab_fp8.cu) for at most swapab_max_rows()
  // (kSwapabMaxRows = 32; 16 under FLASHMLA_SWAPAB_MAX_ROWS=16) query rows per request, as auto does for
  // both caches; more rows under 'swapab' run the default kernel.
  if (!auto_pick && strcmp(kern, "default") != 0 && strcmp(kern, "wgmma") != 0 && strcmp(kern, "swapab") != 0)
    return "FLASHMLA_KERNEL must be unset, 'auto', 'default', 'wgmma' or 'swapab'";
  // FLASHMLA_P_BF16_MIN_KEYS (wgmma kernel): requests with at least this many keys round P to bf16
  // before P V, shorter ones keep it exact to ~2^-16 (hi/lo planes, twice the P V work)
  const char* pk = getenv("FLASHMLA_P_BF16_MIN_KEYS");
  a.p_bf16_min_keys = pk && pk[0] ? atoi(pk) : 1024;
  // FLASHMLA_L2_PREFETCH (BF16 wgmma and swap-AB FP8 kernels): L2 prefetch distance in pages ahead of
  // the producer's loads, 0 (off)..4; unset: kWgmmaL2Prefetch, or kSwapabL2Prefetch for swapab
  const char* pf = getenv("FLASHMLA_L2_PREFETCH");
  a.l2_prefetch_pages = pf && pf[0] ? atoi(pf) : kWgmmaL2Prefetch;
  if (a.l2_prefetch_pages < 0 || a.l2_prefetch_pages > 4) return "FLASHMLA_L2_PREFETCH must be 0..4";
  // FLASHMLA_WGMMA_SPLIT (BF16 wgmma kernel): O columns of the S/softmax warpgroup, 128 or 256
  const char* sp = getenv("FLASHMLA_WGMMA_SPLIT");
  a.wg1_cols = sp && sp[0] ? atoi(sp) : kWgmmaWg1Cols;
  if (a.wg1_cols != 128 && a.wg1_cols != 256) return "FLASHMLA_WGMMA_SPLIT must be 128 or 256";
  // FLASHMLA_FP8_F16=1 (FP8 wgmma kernel, opt-in): f16 consumers (K = V = f16(e4m3 * f16(scale)), Q and P in f16)
  const char* fh = getenv("FLASHMLA_FP8_F16");
  a.fp8_f16 = fh && fh[0] ? atoi(fh) : 0;
  if (a.fp8_f16 != 0 && a.fp8_f16 != 1) return "FLASHMLA_FP8_F16 must be 0 or 1";
  // FLASHMLA_FP8_Q=1 (register-fed swap-AB kernel, opt-in): Q's NoPE part rounded to e4m3 per query row
  const char* fq = getenv("FLASHMLA_FP8_Q");
  a.fp8_q = fq && fq[0] ? atoi(fq) : 0;
  if (a.fp8_q != 0 && a.fp8_q != 1) return "FLASHMLA_FP8_Q must be 0 or 1";
  // FLASHMLA_FP8_PV=1 (register-fed swap-AB kernel at 1..16 rows, opt-in): requests of at least p_bf16_min_keys keys
  // round P^T, the keys' tile scales folded in, to e4m3 and run V's side on the FP8 tensor cores
  const char* fv = getenv("FLASHMLA_FP8_PV");
  a.fp8_pv = fv && fv[0] ? atoi(fv) : 0;
  if (a.fp8_pv != 0 && a.fp8_pv != 1) return "FLASHMLA_FP8_PV must be 0 or 1";
  // FLASHMLA_SWAPAB_RF=0 (opt-out): the FP8 cache at 1..32 rows in the bf16-stage swap-AB kernel (below)
  const char* rf = getenv("FLASHMLA_SWAPAB_RF");
  if (rf && rf[0] && strcmp(rf, "0") != 0 && strcmp(rf, "1") != 0) return "FLASHMLA_SWAPAB_RF must be 0 or 1";
  const bool rf_off = rf && strcmp(rf, "0") == 0;
  // FLASHMLA_SWAPAB_MAX_ROWS: 16 (opt-out) sends 17..32 FP8 rows back to the mma.sync path (launch.h)
  const int sab_rows = swapab_max_rows();
  if (sab_rows < 0) return "FLASHMLA_SWAPAB_MAX_ROWS must be 16 or 32";
  cudaError_t e = cudaSuccess;
  int wg = -1;  // -1: not run (not selected, or tensors TMA cannot address)
  // swap-AB up to sab_rows query rows, under auto for both caches (BF16: H200, session 22, 0.98-1.23x the
  // wgmma kernel at 16-32 rows) or when asked; wgmma above that under auto, or when asked
  const bool want_sab = auto_pick ? m <= sab_rows : strcmp(kern, "swapab") == 0;
  const bool want_wg =
      !want_sab && (auto_pick ? m >= (a.is_fp8 ? kFp8WgmmaMinRows : kAutoWgmmaMinRows) : strcmp(kern, "wgmma") == 0);
  if (want_wg) wg = a.is_fp8 ? launch_mla_decode_wgmma_fp8(a, stream) : launch_mla_decode_wgmma(a, stream);
  g_last_kernel = wg >= 0 ? "wgmma" : "default";
  if (want_sab) {  // -1: more than sab_rows rows, or tensors TMA cannot address
    // FP8 cache, 1..32 rows: the register-fed kernel (mla_decode_swapab_rf.cu; faster than the bf16-stage one at
    // both tile sizes: BENCHMARKS.md session 25), unless FLASHMLA_SWAPAB_RF=0
    const bool pf_set = pf && pf[0];
    if (a.is_fp8 && !pf_set) a.l2_prefetch_pages = kSwapabRfL2Prefetch;
    wg = rf_off || m > sab_rows ? -1 : launch_mla_decode_swapab_rf(a, stream);
    g_last_kernel = "swapab_rf";
    if (wg < 0) {
      if (a.is_fp8 && !pf_set) a.l2_prefetch_pages = kSwapabL2Prefetch;
      wg = launch_mla_decode_swapab(a, stream, sab_rows);
      g_last_kernel = wg >= 0 ? "swapab" : "default";
    }
  }
  if (wg >= 0) {
    e = static_cast<cudaError_t>(wg);
  } else if (a.is_fp8) {  // 64-row tiles do not fit beside the staging buffers: rows go in tiles of 32
    if (m <= 16) e = ks ? launch<1, true, true>(a, st) : launch<1, true, false>(a, st);
    else e = launch<2, true, false>(a, st);
  } else if (m <= 16) {
    e = ks ? launch<1, false, true>(a, st) : launch<1, false, false>(a, st);
  } else if (m <= 32) {
    e = ks ? launch<2, false, true>(a, st) : launch<2, false, false>(a, st);
  } else {
    e = launch<4, false, false>(a, st);
  }
  if (e == cudaSuccess) {
    mla_combine_kernel<<<dim3((m + COMBINE_ROWS - 1) / COMBINE_ROWS, a.batch), 32 * COMBINE_ROWS, 0, st>>>(a);
    e = cudaGetLastError();
  }
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace flashmla
