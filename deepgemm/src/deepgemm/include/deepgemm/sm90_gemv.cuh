// deepgemm small-M FP8 kernel (dense, M <= 8 * MT): D = A B^T with warp-level mma.sync m16n8k32 (e4m3 x e4m3
// -> f32). Appended after sm90_gemm.cuh (uses its PTX wrappers and packers).
//
// At M <= 16 a GEMM is a stream of B's bytes, and its speed is how many of them are in flight. Each warp owns
// 16 rows of B (the MMA's M) and one of KS slices of the K blocks; the rows of A (at most 8 * MT) are the MMA's
// N. The CTA's 8 warps are RG = 8 / KS row groups x KS slices. Every warp streams its K blocks through a ring of
// STAGES shared-memory stages of its own, which its lane 0 fills by TMA (B's 16 x 128 B box, A's box of 8 * MT
// rows, A's scales; 128-byte swizzle, zero fill past N and M) and refills as soon as the warp has read a stage:
// about 8 x STAGES x 2 KB of B per SM in flight. B's scales for the warp's slice are read into shared memory
// once. The slices of a row group are summed in shared memory, in slice order (deterministic); slice 0 writes
// the tile.
//
// The order of k inside a 128-wide K block is free as long as both operands use the same one. Thread
// (g, t) = (lane / 4, lane % 4) reads bytes [32t, 32t + 32) of each of its rows (16-byte chunks 2t and 2t + 1)
// into eight registers; MMA q (q = 0..3, 32 of k each) takes registers 2q and 2q + 1 of rows g and g + 8 as its A
// fragment and the same two registers of A's row as its B fragment, so that in both operands the fragment's
// k index t * 4 + i (and 16 + t * 4 + i) is one and the same byte. Chunks 2t and 2t + 1 under the swizzle put
// rows 2p and 2p + 1 on disjoint banks, so the 16-byte shared loads are conflict-free.
// Promotion: the K block's f32 product times sfb[n / 128][kb] * sfa[m][kb] is added into the accumulator.
// sm_90 has no FP8 mma.sync unit: ptxas lowers each MMA to e4m3 -> f16 conversions (F2FP) and two f16 HMMAs,
// exact, but 12 conversions an MMA, which is what the kernel spends at M = 16 (BENCHMARKS.md run 21).

namespace dg {

__device__ __forceinline__ void mma_e4m3_m16n8k32(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

constexpr int kGemvWarps = 8;

// shared memory: per warp and stage a B box (16 x 128 B), an A box (8 * MT x 128 B) and A's scales (<= 16
// floats in 128 B); per warp its slice's B scales; per warp and stage a full barrier
template <int MT, int STAGES, int KPW>
struct GemvPlan {
  static constexpr int kB = 16 * 128, kA = 8 * MT * 128, kSFA = 128;  // a TMA destination: 128-byte aligned
  static constexpr int kRing = kGemvWarps * STAGES;
  static constexpr int kOffA = kRing * kB, kOffSFA = kOffA + kRing * kA, kOffSFB = kOffSFA + kRing * kSFA;
  static constexpr int kOffBar = kOffSFB + kGemvWarps * ((KPW * 4 + 7) / 8 * 8);
  static constexpr int kTotal = 1024 + kOffBar + kRing * 8;
  static_assert(kRing * kB >= kGemvWarps * 4 * MT * 32 * 4, "the slices' reduction fits in the B ring");
};

template <int OUT, int CT, int N, int K, int MT, int KS, int STAGES>
__device__ __forceinline__ void gemv_body(const TmaDesc& tma_a, const TmaDesc& tma_b, const TmaDesc& tma_sfa,
                                          const float* __restrict__ sfb, void* __restrict__ d_ptr,
                                          const void* __restrict__ c_ptr, int M) {
  static_assert(K % 128 == 0 && N % 8 == 0, "K, N");
  static_assert(MT == 1 || MT == 2, "MT: 8 or 16 rows of A");
  static_assert(KS == 1 || KS == 2 || KS == 4 || KS == 8, "KS");
  constexpr int KB = K / 128, RG = kGemvWarps / KS, KPW = (KB + KS - 1) / KS;
  static_assert(KS <= KB, "more K slices than K blocks");
  using Plan = GemvPlan<MT, STAGES, KPW>;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  u32 base = smem_addr(smem_raw);
  const u32 pad = (1024 - (base & 1023)) & 1023;
  unsigned char* smem = smem_raw + pad;
  base += pad;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n0 = (blockIdx.x * RG + warp / KS) * 16, slice = warp % KS;
  const int kb_lo = slice * KB / KS, nblk = (slice + 1) * KB / KS - kb_lo;
  const int ring = warp * STAGES;  // this warp's first stage
  const u32 bars = base + Plan::kOffBar + 8 * ring;
  float* sfb_s = reinterpret_cast<float*>(smem + Plan::kOffSFB) + warp * ((KPW + 1) / 2 * 2);
  if (threadIdx.x == 0) require_dynamic_smem(Plan::kTotal);
  const bool active = n0 < N;
  if (active && lane == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) mbar_init(bars + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    fence_proxy_async();
  }
  grid_dep_launch();
  grid_dep_wait();  // DEEPGEMM_PDL (sm90_gemm.cuh)
  __syncwarp();

  const u32 tx = Plan::kB + Plan::kA + (M + 3) / 4 * 16;  // A's box: 8 * MT rows; its scales' box: M rounded up to 4
  const u64 pol_b = l2_policy_b();
  auto fill = [&](int i) {  // lane 0: block kb_lo + i into stage i % STAGES
    const int s = i % STAGES, kb = kb_lo + i;
    const u32 full = bars + 8 * s;
    mbar_expect_tx(full, tx);
    tma_load_2d_b(base + (ring + s) * Plan::kB, &tma_b, full, kb * 128, n0, pol_b);
    tma_load_2d(base + Plan::kOffA + (ring + s) * Plan::kA, &tma_a, full, kb * 128, 0);
    tma_load_2d(base + Plan::kOffSFA + (ring + s) * Plan::kSFA, &tma_sfa, full, 0, kb);
  };
  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;

  if (active) {
    if (lane == 0)
      for (int i = 0; i < STAGES && i < nblk; ++i) fill(i);
    for (int i = lane; i < nblk; i += 32) sfb_s[i] = sfb[(n0 / 128) * KB + kb_lo + i];
    __syncwarp();
    const int c0 = (2 * t) ^ (g & 7), c1 = (2 * t + 1) ^ (g & 7);  // swizzled chunks 2t, 2t + 1 of rows g, g + 8
    for (int i = 0; i < nblk; ++i) {
      const int s = i % STAGES;
      mbar_wait(bars + 8 * s, (i / STAGES) & 1);
      const unsigned char* sb_ = smem + (ring + s) * Plan::kB;
      const unsigned char* sa_ = smem + Plan::kOffA + (ring + s) * Plan::kA;
      const float* sf_ = reinterpret_cast<const float*>(smem + Plan::kOffSFA + (ring + s) * Plan::kSFA);
      u32 wb[2][8], wa[MT][8];
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // rows g and g + 8 of B
        *reinterpret_cast<Vec16*>(&wb[h][0]) = *reinterpret_cast<const Vec16*>(sb_ + (g + 8 * h) * 128 + c0 * 16);
        *reinterpret_cast<Vec16*>(&wb[h][4]) = *reinterpret_cast<const Vec16*>(sb_ + (g + 8 * h) * 128 + c1 * 16);
      }
#pragma unroll
      for (int j = 0; j < MT; ++j) {  // row 8j + g of A
        *reinterpret_cast<Vec16*>(&wa[j][0]) = *reinterpret_cast<const Vec16*>(sa_ + (8 * j + g) * 128 + c0 * 16);
        *reinterpret_cast<Vec16*>(&wa[j][4]) = *reinterpret_cast<const Vec16*>(sa_ + (8 * j + g) * 128 + c1 * 16);
      }
      const float sb = sfb_s[i];
      float sa[MT][2];
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) sa[j][e] = 8 * j + 2 * t + e < M ? sf_[8 * j + 2 * t + e] * sb : 0.f;
      fence_regs(wb[0]);
      fence_regs(wb[1]);
#pragma unroll
      for (int j = 0; j < MT; ++j) fence_regs(wa[j]);
      __syncwarp();  // every lane holds the stage's bytes in registers: lane 0 may refill it
      if (lane == 0 && i + STAGES < nblk) {
        fence_proxy_async();
        fill(i + STAGES);
      }
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        float p[4][4];  // one product per MMA: four short dependency chains instead of one long one
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const u32 fa[4] = {wb[0][2 * q], wb[1][2 * q], wb[0][2 * q + 1], wb[1][2 * q + 1]};
          p[q][0] = p[q][1] = p[q][2] = p[q][3] = 0.f;
          mma_e4m3_m16n8k32(p[q], fa, wa[j][2 * q], wa[j][2 * q + 1]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e)
          acc[j][e] += ((p[0][e] + p[1][e]) + (p[2][e] + p[3][e])) * sa[j][e & 1];
      }
    }
  }

  if constexpr (KS > 1) {  // slice 0 of each row group adds the other slices' tiles, in slice order
    __syncthreads();  // every warp is past its last stage: the B ring is free
    // [warp][4 MT][32] in the pad and the B ring, from the unaligned base: no register holds smem across the K loop
    float* red = reinterpret_cast<float*>(smem_raw);
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[(warp * 4 * MT + 4 * j + i) * 32 + lane] = acc[j][i];
    __syncthreads();
    if (slice != 0) return;
#pragma unroll
    for (int s = 1; s < KS; ++s)
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] += red[((warp + s) * 4 * MT + 4 * j + i) * 32 + lane];
  }
  if (!active) return;

  // accumulator (j, i): row n0 + g + 8 (i / 2) of B, row 8j + 2t + i % 2 of A
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = 8 * j + 2 * t + (i & 1), n = n0 + g + 8 * (i >> 1);
      if (m < M && n < N) store_one<OUT, CT>(d_ptr, c_ptr, (long long)m * N + n, acc[j][i]);
    }
}

}  // namespace dg
