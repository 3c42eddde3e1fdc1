// deepgemm SM90 swap-AB GEMM for tiny M (FP8 only): D^T = B A^T, so that 64 rows of B (the N
// dimension) fill WGMMA's 64-row M dimension and the few rows of A become WGMMA's N (BMS = 8 or 16).
// Appended after sm90_gemm.cuh (uses its PTX wrappers, Scheduler and Wgmma<BMS, true>).
//
// One producer warpgroup (one thread issues the TMA loads of a 64 x 128 B tile, a BMS x 128 A tile
// and BMS of A's scales per K block into a ring of STAGES buffers) and one consumer warpgroup. The
// accumulator is tiny (BMS / 2 floats per thread), so no setmaxnreg. Promotion per 128 of K: the
// K block's product is scaled by sfb[n block][kb] (one value: a 64-row tile never straddles a
// 128-row scale block) times sfa[row of A][kb] (per accumulator column) and added in FP32.
// Epilogue: direct, element by element (the output is BMS x 64 per tile: small next to B's bytes).

namespace dg {

template <bool FP8, int K, int BMS, int STAGES>
struct SwapPlan {
  // A's scales take BMS * 4 (32 or 64) bytes a stage, padded to 128: a TMA destination in shared
  // memory must be 128-byte aligned (unpadded, every odd stage faulted: misaligned address)
  static constexpr int kABytes = BMS * 128, kBBytes = 64 * 128, kSFABytes = 128;
  static constexpr int kTotal = 1024 + STAGES * (kABytes + kBBytes + kSFABytes) + 16 * STAGES;
};

// PIPE = 0: one K block in flight (wait, promote, next); PIPE = 1: two (double-buffered products,
// in unrolled chunks: with a run-time loop around them ptxas serialises the WGMMAs, warning C7518).
template <int KIND, int OUT, int CT, int N, int K, int BMS, int STAGES, int PIPE>
__device__ __forceinline__ void gemm_swap_body(const TmaDesc& tma_a, const TmaDesc& tma_b, const TmaDesc& tma_sfa,
                                               const float* __restrict__ sfb, void* __restrict__ d_ptr,
                                               const void* __restrict__ c_ptr, const int* __restrict__ grouped,
                                               int M, int num_groups, int a_box_rows, int sfa_box) {
  static_assert(KIND == kDense || KIND == kMasked, "swap-AB: dense and masked layouts");
  static_assert(BMS == 8 || BMS == 16, "swap-AB: BMS (rows of A per tile) is 8 or 16");
  static_assert(K % 128 == 0, "K");
  static_assert(PIPE == 0 || STAGES >= 2, "two K blocks in flight need two stages");
  constexpr int KB = K / 128, SFB_NB = (N + 127) / 128;
  constexpr int NB = (N + 63) / 64;
  using Plan = SwapPlan<true, K, BMS, STAGES>;
  constexpr int A_BYTES = Plan::kABytes, B_BYTES = Plan::kBBytes, SFA_BYTES = Plan::kSFABytes;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  u32 base = smem_addr(smem_raw);
  const u32 pad = (1024 - (base & 1023)) & 1023;
  unsigned char* smem = smem_raw + pad;
  base += pad;
  const u32 sA = base, sB = sA + STAGES * A_BYTES, sSFA = sB + STAGES * B_BYTES;
  const u32 bars = sSFA + STAGES * SFA_BYTES;  // full[s] at bars + 8s, empty[s] at bars + 8(STAGES + s)
  const float* sfa_smem = reinterpret_cast<const float*>(smem + (sSFA - base));

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    require_dynamic_smem(Plan::kTotal);
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bars + 8 * s, 1);
      mbar_init(bars + 8 * (STAGES + s), 4);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  if (warp == 4 && lane == 0) {
    tma_prefetch(&tma_a);
    tma_prefetch(&tma_b);
    tma_prefetch(&tma_sfa);
  }
  grid_dep_launch();
  grid_dep_wait();  // DEEPGEMM_PDL (sm90_gemm.cuh)
  __syncthreads();

  Scheduler<KIND, BMS, NB> sched(M, num_groups, grouped);
  int m_blk, n_blk, g;
  if (warp >= 4) {
    // producer warpgroup: one thread streams the K blocks of every tile of this CTA
    if (warp == 4 && lane == 0) {
      u32 it = 0;
      const u64 pol_b = l2_policy_b();
      while (sched.next(m_blk, n_blk, g)) {
        const int a_row = (KIND == kMasked ? g * M : 0) + m_blk * BMS;
        const int b_row = (KIND == kDense ? 0 : g * N) + n_blk * 64;
        const int sf_y0 = KIND == kMasked ? g * (K / 128) : 0;
        for (int kb = 0; kb < KB; ++kb, ++it) {
          const u32 s = it % STAGES, ph = (it / STAGES) & 1;
          const u32 full = bars + 8 * s, empty = bars + 8 * (STAGES + s);
          mbar_wait(empty, ph ^ 1);
          mbar_expect_tx(full, a_box_rows * 128 + B_BYTES + sfa_box * 4);
          tma_load_2d_b(sB + s * B_BYTES, &tma_b, full, kb * 128, b_row, pol_b);
          tma_load_2d(sA + s * A_BYTES, &tma_a, full, kb * 128, a_row);
          tma_load_2d(sSFA + s * SFA_BYTES, &tma_sfa, full, m_blk * BMS, sf_y0 + kb);
        }
      }
    }
    return;
  }

  // consumer warpgroup: accumulator rows = B rows n0 + r_in_wg (+ 8), columns = A rows (lane % 4) * 2 + 8j (+ 1)
  const int r_in_wg = warp * 16 + lane / 4;
  constexpr int R = BMS / 2;  // accumulator floats per thread
  u32 it = 0;
  bool have = sched.next(m_blk, n_blk, g);
  auto sfb_ptr = [&](int nb_, int g_) { return sfb + ((KIND == kDense ? 0 : g_) * SFB_NB + nb_ * 64 / 128) * (K / 128); };
  const float* sfb_row = have ? sfb_ptr(n_blk, g) : sfb;
  float sb_next = have ? sfb_row[0] : 0.f;
  while (have) {
    int nm_blk = 0, nn_blk = 0, ng = 0;
    const bool have_next = sched.next(nm_blk, nn_blk, ng);
    const float* nrow = have_next ? sfb_ptr(nn_blk, ng) : sfb_row;
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = 0.f;
    // waits for K block kb's stage, reads its scales into sc and issues its 4 WGMMAs into tt (one commit group)
    auto issue = [&](int kb, float (&tt)[R], float (&sc)[BMS / 4]) {
      const u32 s = (it + kb) % STAGES, ph = ((it + kb) / STAGES) & 1;
      mbar_wait(bars + 8 * s, ph);
      const float sb = sb_next;  // B's scale for this K block; fetch the next one (maybe the next tile's)
      sb_next = *(kb + 1 < KB ? sfb_row + kb + 1 : nrow);  // nrow == sfb_row after the last tile
#pragma unroll
      for (int j = 0; j < BMS / 8; ++j) {  // sfa * sfb for this thread's columns (lane % 4) * 2 + 8j + {0, 1}
        sc[2 * j] = sfa_smem[s * (SFA_BYTES / 4) + j * 8 + (lane % 4) * 2] * sb;
        sc[2 * j + 1] = sfa_smem[s * (SFA_BYTES / 4) + j * 8 + (lane % 4) * 2 + 1] * sb;
      }
      const u32 a_addr = sB + s * B_BYTES, b_addr = sA + s * A_BYTES;  // WGMMA's A is our B and vice versa
      fence_regs(tt);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) Wgmma<BMS, true>::mma(tt, make_desc(a_addr + 32 * k), make_desc(b_addr + 32 * k), k);
      wgmma_commit();
    };
    // after K block kb's WGMMAs have completed: free its stage, add the scaled product into acc
    auto retire = [&](int kb, float (&tt)[R], const float (&sc)[BMS / 4]) {
      fence_regs(tt);
      __syncwarp();
      if (lane == 0) mbar_arrive(bars + 8 * (STAGES + (it + kb) % STAGES));
#pragma unroll
      for (int j = 0; j < BMS / 8; ++j) {
        acc[j * 4 + 0] += tt[j * 4 + 0] * sc[2 * j];
        acc[j * 4 + 1] += tt[j * 4 + 1] * sc[2 * j + 1];
        acc[j * 4 + 2] += tt[j * 4 + 2] * sc[2 * j];
        acc[j * 4 + 3] += tt[j * 4 + 3] * sc[2 * j + 1];
      }
    };
    if constexpr (PIPE == 0) {
      float t[R], sc[BMS / 4];
      for (int kb = 0; kb < KB; ++kb) {
        issue(kb, t, sc);
        wgmma_wait<0>();
        retire(kb, t, sc);
      }
    } else {
      // two K blocks in flight (two_in_flight), in chunks of CH blocks drained at the end of each
      constexpr int CH = KB <= 16 ? KB : KB % 8 == 0 ? 8 : KB % 4 == 0 ? 4 : KB % 2 == 0 ? 2 : 1;
      for (int c0 = 0; c0 < KB; c0 += CH) {
        float t0[R], t1[R], sc0[BMS / 4], sc1[BMS / 4];
        two_in_flight<CH>(c0, issue, retire, t0, t1, sc0, sc1);
      }
    }
    it += KB;

    // epilogue: D[row_off + m][n] = acc (+ C), m < limit, n < N
    int limit;
    long long row_off;
    valid_rows<KIND>(grouped, g, M, limit, row_off);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int j = i / 4, e = i % 4;
      const int m = m_blk * BMS + j * 8 + (lane % 4) * 2 + (e & 1);
      const int n = n_blk * 64 + r_in_wg + (e >> 1) * 8;
      if (m >= limit || n >= N) continue;
      store_one<OUT, CT>(d_ptr, c_ptr, (row_off + m) * (long long)N + n, acc[i]);
    }
    have = have_next; m_blk = nm_blk; n_blk = nn_blk; g = ng;
    sfb_row = nrow;
  }
}

}  // namespace dg
