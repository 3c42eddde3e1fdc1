// deepgemm SM90 GEMM: D = A @ B^T (+ C), FP8 (1x128 / 128x128 scaled) or BF16 inputs.
//
// Persistent, warp-specialised kernel: one producer warpgroup (one thread issues TMA loads of
// A, B and A's scales into a ring of STAGES shared-memory buffers) and NUM_MATH_WG consumer
// warpgroups (64 rows of the BM x BN tile each, or with KSPLIT the same 64 rows and alternate K
// blocks) issuing WGMMA on 128-byte-swizzled tiles. FP8: each 128-wide K block is multiplied into a
// fresh register tile, which is then scaled by sfa[row] * sfb[block] and added into the FP32
// accumulator ("promotion" every 128 of K). B's scales are read from global memory one K block ahead.
//
// No #include: the file compiles under NVRTC and nvcc alike. The JIT (deepgemm/jit) prepends the
// Wgmma<BN, FP8> specialisation it needs and appends an extern "C" kernel that calls gemm_body
// with every shape constant as a template argument.

namespace dg {

typedef unsigned int u32;
typedef unsigned long long u64;

enum Kind { kDense = 0, kContiguous = 1, kMasked = 2 };
enum OutType { kOutBF16 = 0, kOutF32 = 1, kOutFP8 = 2 };
enum CType { kNoC = 0, kCF32 = 1, kCBF16 = 2 };

struct __align__(64) TmaDesc { u64 data[16]; };  // CUtensorMap, passed by value
struct __align__(16) Vec16 { u32 x, y, z, w; };
struct __align__(8) Float2 { float x, y; };

template <int N, bool FP8> struct Wgmma;  // specialised by the JIT: mma(d, desc_a, desc_b, scale_d)
template <int N> struct WgmmaRS;  // FP8, A from registers (the JIT specialises it): mma(d, a[4], desc_b, scale_d)

// ---- PTX wrappers ---------------------------------------------------------------------------
__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  u32 done = 0;
  while (!done) {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  }
}
__device__ __forceinline__ void tma_load_2d(u32 dst, const TmaDesc* desc, u32 bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4}], [%2];"
               :: "r"(dst), "l"(reinterpret_cast<u64>(desc)), "r"(bar), "r"(c0), "r"(c1) : "memory");
}
// B's boxes: under DG_L2_EVICT_FIRST_B (defined by the JIT where DEEPGEMM_L2_HINT asks: by default at M <= 128) with
// an L2 evict_first hint, so that B, read once at small M, leaves the L2 before what is read again (A, the scales,
// split-K's partials); else plain
__device__ __forceinline__ u64 l2_policy_b() {
  u64 p = 0;
#ifdef DG_L2_EVICT_FIRST_B
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
  return p;
}
__device__ __forceinline__ void tma_load_2d_b(u32 dst, const TmaDesc* desc, u32 bar, int c0, int c1, u64 policy) {
#ifdef DG_L2_EVICT_FIRST_B
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
               " [%0], [%1, {%3, %4}], [%2], %5;"
               :: "r"(dst), "l"(reinterpret_cast<u64>(desc)), "r"(bar), "r"(c0), "r"(c1), "l"(policy) : "memory");
#else
  tma_load_2d(dst, desc, bar, c0, c1);
#endif
}
// MCAST: the same box lands at the same shared-memory offset in every CTA of ctaMask, and each CTA's
// mbarrier at offset `bar` receives the complete_tx of its copy.
__device__ __forceinline__ void tma_load_2d_mcast(u32 dst, const TmaDesc* desc, u32 bar, int c0, int c1, unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%3, %4}], [%2], %5;"
               :: "r"(dst), "l"(reinterpret_cast<u64>(desc)), "r"(bar), "r"(c0), "r"(c1), "h"(mask) : "memory");
}
// arrive on the mbarrier at the same offset in CTA `cta` of this cluster. Default semantics (release at CTA
// scope), as CUTLASS's ClusterBarrier::arrive(cta_id): the consumer only signals that its WGMMAs (retired by
// wgmma.wait_group) are done reading the stage. `.release.cluster` made ptxas put MEMBAR.ALL.GPU + ERRBAR +
// CGAERRBAR before every such arrive, i.e. a wait for all of the warp's outstanding global accesses (the
// scale prefetch, the previous tile's stores) once per K block: multicast kernels ran at about half speed.
__device__ __forceinline__ void mbar_arrive_cluster(u32 bar, u32 cta) {
  asm volatile("{\n .reg .b32 r;\n mapa.shared::cluster.u32 r, %0, %1;\n"
               " mbarrier.arrive.shared::cluster.b64 _, [r];\n}" :: "r"(bar), "r"(cta) : "memory");
}
// TMA store of one box from shared memory (bulk-group completion); the box is clipped at the tensor's bounds
__device__ __forceinline__ void tma_store_2d(const TmaDesc* desc, u32 src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               :: "l"(reinterpret_cast<u64>(desc)), "r"(src), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// generic-proxy shared-memory writes become visible to the async proxy (TMA) after this (+ a barrier)
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n barrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ void tma_prefetch(const TmaDesc* desc) {
  asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<u64>(desc)) : "memory");
}
// programmatic dependent launch (DEEPGEMM_PDL): a kernel launched with it may start while the previous kernel
// of the stream is still running; it must not touch global memory before grid_dep_wait, which returns once that
// kernel has finished and its writes are visible. grid_dep_launch lets the next such kernel's CTAs start on
// SMs ours leave. Both are no-ops in a kernel launched without the attribute.
__device__ __forceinline__ void grid_dep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void grid_dep_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void named_bar_sync(u32 id, u32 threads) {
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
// four 8 x 8 b16 matrices: lanes 8i..8i+7 give the row addresses of matrix i, which lands in r[i]
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
// L2-only (L1-bypassing) global accesses for the split-K workspace, and a named barrier that ORs a predicate
__device__ __forceinline__ void st_cg(float* p, float v) { asm volatile("st.global.cg.f32 [%0], %1;" :: "l"(p), "f"(v) : "memory"); }
__device__ __forceinline__ float ld_cg(const float* p) {
  float v; asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ float shfl_idx(float v, int src) {
  float r; asm volatile("shfl.sync.idx.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(src)); return r;
}
__device__ __forceinline__ u32 bar_red_or(u32 id, u32 threads, u32 pred) {
  u32 r;
  asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 q, %3, 0;\n bar.red.or.pred p, %1, %2, q;\n selp.u32 %0, 1, 0, p;\n}"
               : "=r"(r) : "r"(id), "r"(threads), "r"(pred) : "memory");
  return r;
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(kPending) : "memory");
}
template <int R> __device__ __forceinline__ void fence_regs(float (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i]) :: "memory");
}
template <int R> __device__ __forceinline__ void fence_regs(u32 (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(r[i]) :: "memory");
}
// Shared-memory matrix descriptor: K-major tile whose rows are 128 bytes, 128-byte swizzle,
// 8-row core groups 1024 bytes apart (tile base 1024-aligned).
__device__ __forceinline__ u64 make_desc(u32 addr) {
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}
__device__ __forceinline__ float bits_to_float(u32 u) { float f; asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u)); return f; }
// v0, v1 += C[off], C[off + 1] (C: FP32 or BF16 pairs; nothing for kNoC)
template <int CT>
__device__ __forceinline__ void add_c(const void* __restrict__ c_ptr, long long off, float& v0, float& v1) {
  if constexpr (CT == kCF32) {
    const float* cp = reinterpret_cast<const float*>(c_ptr) + off;
    v0 += cp[0]; v1 += cp[1];
  } else if constexpr (CT == kCBF16) {
    const u32 cv = *reinterpret_cast<const u32*>(reinterpret_cast<const unsigned short*>(c_ptr) + off);
    v0 += bits_to_float(cv << 16); v1 += bits_to_float(cv & 0xFFFF0000u);
  }
}
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
  u32 r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ unsigned short pack_fp8(float lo, float hi) {
  unsigned short r; asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo)); return r;
}
// one output element, D[off] = v (+ C[off]), in OUT's type (the swap-AB and small-M kernels' epilogues)
template <int OUT, int CT>
__device__ __forceinline__ void store_one(void* __restrict__ d_ptr, const void* __restrict__ c_ptr, long long off,
                                          float v) {
  if constexpr (CT == kCF32) v += reinterpret_cast<const float*>(c_ptr)[off];
  else if constexpr (CT == kCBF16) v += bits_to_float((u32)reinterpret_cast<const unsigned short*>(c_ptr)[off] << 16);
  if constexpr (OUT == kOutBF16) {
    reinterpret_cast<unsigned short*>(d_ptr)[off] = (unsigned short)(pack_bf16(v, 0.f) & 0xFFFFu);
  } else if constexpr (OUT == kOutF32) {
    reinterpret_cast<float*>(d_ptr)[off] = v;
  } else {
    reinterpret_cast<unsigned char*>(d_ptr)[off] = (unsigned char)(pack_fp8(v, 0.f) & 0xFFu);
  }
}
// traps when the launch gave less dynamic shared memory than the kernel's layout needs
__device__ __forceinline__ void require_dynamic_smem(u32 bytes) {
  u32 dyn;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
  if (dyn < bytes) asm volatile("trap;");
}

// Two K blocks' WGMMAs in flight over the CH blocks from c0: block kb + 1's WGMMAs run while block kb
// is retired (promoted). issue(kb, t, sc) waits for kb's stage and commits its WGMMAs into t; retire(kb,
// t, sc) consumes them. ptxas keeps the two commit groups overlapped only in straight-line code (a
// run-time loop around them serialises the WGMMAs, warning C7518), hence the unrolled chunk.
template <int CH, typename Issue, typename Retire, typename T, typename S>
__device__ __forceinline__ void two_in_flight(int c0, Issue&& issue, Retire&& retire, T& t0, T& t1, S& sc0, S& sc1) {
  issue(c0, t0, sc0);
#pragma unroll
  for (int q = 0; q < CH; q += 2) {
    if (q + 1 < CH) { issue(c0 + q + 1, t1, sc1); wgmma_wait<1>(); } else { wgmma_wait<0>(); }
    retire(c0 + q, t0, sc0);
    if (q + 1 < CH) {
      if (q + 2 < CH) { issue(c0 + q + 2, t0, sc0); wgmma_wait<1>(); } else { wgmma_wait<0>(); }
      retire(c0 + q + 1, t1, sc1);
    }
  }
}

// K blocks kb, kb + step, ... below kb_end in pairs, each pair's WGMMAs in flight together (straight-line within
// a pair, so ptxas keeps both commit groups in flight inside the run-time loop). issue(kb, t, sc) waits for kb's
// stage and commits its WGMMAs into t, returning what retire(x, t, sc) needs. Returns the first block not taken
// (an odd last one, for the caller).
template <typename Issue, typename Retire, typename T, typename S>
__device__ __forceinline__ int pairs_in_flight(int kb, int kb_end, int step, Issue&& issue, Retire&& retire, T& t0,
                                               T& t1, S& sc0, S& sc1) {
  for (; kb + step < kb_end; kb += 2 * step) {
    const auto x0 = issue(kb, t0, sc0);
    const auto x1 = issue(kb + step, t1, sc1);
    wgmma_wait<1>();
    retire(x0, t0, sc0);
    wgmma_wait<0>();
    retire(x1, t1, sc1);
  }
  return kb;
}

// Rows of the output a tile may write: masked layout, group g holds masked_m[g] (clamped to [0, M])
// valid rows starting at row g * M; otherwise all M rows from row 0.
template <int KIND>
__device__ __forceinline__ void valid_rows(const int* grouped, int g, int M, int& limit, long long& row_off) {
  limit = M;
  row_off = 0;
  if (KIND == kMasked) {
    const int mg = grouped[g];
    limit = mg < 0 ? 0 : (mg > M ? M : mg);
    row_off = (long long)g * M;
  }
}

// ---- tile scheduler (identical sequence in producer and consumers) ---------------------------
// 2-CTA clusters (cluster rank = blockIdx.x % 2 for cluster dims (2, 1, 1)): both CTAs of a cluster walk
// the same sequence of units. MC = 1 (dense): a unit is an (M block pair, N block), the CTAs take M blocks
// 2p and 2p + 1 and share the B tile (the host guarantees an even number of M blocks). MC = 2 (dense,
// masked): a unit is an (M block, N block pair), the CTAs take N blocks 2p and 2p + 1 and share the A tile
// (the host guarantees an even number of N blocks). The grid is even.
template <int KIND, int BM, int NB, int MC = 0>
struct Scheduler {
  static constexpr int NU = MC == 2 ? NB / 2 : NB;  // N units
  int M, G, t, num_mb, cur_g, g_base;
  const int* grouped;
  __device__ Scheduler(int m, int g, const int* gr)
      : M(m), G(g), t(MC ? (int)(blockIdx.x >> 1) - (int)(gridDim.x >> 1) : (int)blockIdx.x - (int)gridDim.x),
        num_mb(MC == 1 ? (m + BM - 1) / BM / 2 : (m + BM - 1) / BM), cur_g(0), g_base(0), grouped(gr) {}

  __device__ bool next(int& m_blk, int& n_blk, int& g) {
    constexpr int kBand = 16;  // N blocks per raster band: concurrent tiles share A rows and B rows in L2
    static_assert(MC != 1 || KIND == kDense, "multicast of B: dense layout only");
    static_assert(MC != 2 || (KIND != kContiguous && NB % 2 == 0), "multicast of A: dense or masked, even N blocks");
    const int rank = (int)(blockIdx.x & 1);
    while (true) {
      t += MC ? (int)(gridDim.x >> 1) : (int)gridDim.x;
      if (KIND == kMasked) {
        while (cur_g < G) {
          int mg = grouped[cur_g];
          mg = mg < 0 ? 0 : (mg > M ? M : mg);
          const int mb = (mg + BM - 1) / BM;
          if (t < g_base + mb * NU) {
            const int loc = t - g_base;
            n_blk = loc / mb; m_blk = loc - n_blk * mb; g = cur_g;
            if (MC == 2) n_blk = 2 * n_blk + rank;
            return true;
          }
          g_base += mb * NU; ++cur_g;
        }
        return false;
      }
      if (t >= num_mb * NU) return false;
      const int band = t / (num_mb * kBand), rem = t - band * num_mb * kBand;
      const int n0 = band * kBand, bw = NU - n0 < kBand ? NU - n0 : kBand;
      m_blk = rem / bw; n_blk = n0 + rem % bw; g = 0;
      if (MC == 1) m_blk = 2 * m_blk + rank;
      if (MC == 2) n_blk = 2 * n_blk + rank;
      if (KIND == kContiguous) {
        g = grouped[m_blk * BM];
        if (g < 0) continue;  // a block of padding rows: nothing to compute or write
      }
      return true;
    }
  }
};

// ---- shared-memory plan (the host computes the same total in deepgemm/jit/kernels.py) --------
template <bool FP8, int K, int BM, int BN, int STAGES, int EPI, int KSPLIT, int TSTORE = 0, int SFA_ROWS = 0,
          int SFA_KB = 0>
struct SmemPlan {
  static constexpr int kABytes = BM * 128, kBBytes = BN * 128, kSFABytes = FP8 && !SFA_ROWS ? BM * 4 : 0;
  // SFA_ROWS: A's scales of rows [0, SFA_ROWS) in SFA_KB K blocks, loaded once, and their mbarrier
  static constexpr int kSFAOnceBytes = SFA_ROWS ? SFA_ROWS * SFA_KB * 4 + 16 : 0;
  // staged BF16 epilogue: padded rows (conflict-free writes), kEW columns per pass (FP8 BN = 256: four
  // 64-column passes, so that the staging fits beside 4 pipeline stages)
  static constexpr int kEW = (FP8 && BN > 128) ? 64 : BN;
  static constexpr int kPitch = kEW * 2 + 16;
  // TSTORE: one 128-byte-swizzled 64 x 64 BF16 box (8 KB) per warpgroup and 64-column pass, 1024-aligned
  // after the B stages, TMA-stored to global
  static constexpr int kEpiBytes = TSTORE ? (BM / 64) * (BN / 64) * 8192 : EPI ? (BM / 64) * 64 * kPitch : 0;
  static constexpr int kRedBytes = KSPLIT ? 128 * (BN / 2) * 4 : 0;  // K-split partial sums
  static constexpr int kTotal =
      1024 + STAGES * (kABytes + kBBytes + kSFABytes) + kSFAOnceBytes + 16 * STAGES + kEpiBytes + kRedBytes;
};

// EPI = 0: registers -> global directly (any output type); EPI = 1 (BF16 output): registers ->
// padded shared-memory tile -> 16-byte coalesced global stores.
// PIPE = 1 (FP8, no KSPLIT): two K blocks in flight per consumer warpgroup (block kb + 1's WGMMAs run
// while block kb is promoted), in unrolled chunks of 4 (a run-time loop around them makes ptxas serialise
// the WGMMAs, warning C7518). Three BN/2 register tiles: where ptxas spills, the JIT falls back to PIPE = 0.
// With SPLITK (KSPLIT allowed) the slice's blocks go in pairs instead (see the SPLITK mainloop).
// KSPLIT = 1 (FP8, BM = 64): two consumer warpgroups share each 64-row tile, taking alternate K
// blocks; warpgroup 1 hands its partial sums to warpgroup 0 through shared memory at the end.
// STAGES must then be even (the host guarantees it): each warpgroup waits only on the full barriers
// of its own K blocks, and a parity wait cannot tell a phase from the one two phases earlier, so a
// stage must never alternate between the warpgroups within a tile (named barrier 3 orders them
// across tiles). With odd STAGES a warpgroup could pass the wait while the other's TMA load into
// that stage was still in flight (see stages_ok_for_ksplit in deepgemm/jit/kernels.py).
// MCAST (kernel launched in 2-CTA clusters): 1 (dense, no KSPLIT/PIPE): the two CTAs of a cluster compute
// vertically adjacent tiles with the same B tile; each producer loads its own A and one half of B,
// multicast into both CTAs. 2 (dense or masked, no PIPE; small M): horizontally adjacent tiles with the
// same A tile; each loads its own B and one half of A's box. Either way each SM pulls fewer bytes from
// L2. A stage may then be refilled only when the consumers of both CTAs have released it: every consumer
// warp arrives on the empty barrier of its own CTA and of the peer (count doubled). No CTA exits before
// its peer (cluster barrier at the end): the peer may still multicast into it or arrive on its barriers.
// FP8 BN = 256 (DEEPGEMM_BN256, BM = 128): each consumer warpgroup takes the B tile in two 128-column halves
// per K block (see WIDE below). TSTORE = 1 (BF16 output, staged, BN % 64 == 0; DEEPGEMM_TMA_STORE): the
// epilogue writes one 128-byte-swizzled 64 x 64 box per 64-column pass (placed after the B stages, 1024-
// aligned) and one thread per warpgroup TMA-stores them (tma_d: D as [(G *) M, N]; a grouped box with rows
// that must stay untouched is stored directly instead); it waits for the previous
// tile's stores to have read the boxes before rewriting them, and for all of them before the CTA exits.
// SPLITK = S > 0 (DEEPGEMM_SPLIT_K; FP8 dense, direct epilogue, no MCAST 1/TSTORE/wide tile): cross-CTA
// split-K. A work unit is (tile, slice): slice s of S takes K blocks [s * KB / S, (s + 1) * KB / S) (at least
// one each: S <= KB). Each unit accumulates its slice as usual (same per-block promotion), writes its FP32
// partial tile to workspace slot (tile * S + s) of ws (BM * BN floats, register-native layout: element
// i * ET + tid holds accumulator register i of epilogue thread tid, so every access is coalesced), then
// each writing thread fences (__threadfence) and, after a barrier, one thread adds 1 to the tile's counter
// (tile_ctr, int32, zero between launches). The unit that brings it to S is the tile's last: it resets the
// counter to 0 (CUDA graph replays need no memset), fences again (acquire), and its threads sum the S
// partials from L2 in slice order 0..S-1 (deterministic: not in arrival order), then run the direct
// epilogue (C added, output type converted) on the sum. Other units write nothing to D.
// SFA_ROWS > 0 (FP8 dense, M <= SFA_ROWS; DEEPGEMM_SFA_ONCE): A's scales of every row come in one TMA box on an
// mbarrier of their own with the CTA's first tile, instead of a third box in every stage: at small M every tile of
// the CTA has the same rows of A, and a stage's third box cost the load stream ~12 % (BENCHMARKS.md run 33). The box
// (sfa_box rows x SFA_KB blocks, the tensor map boxed so) holds every K block, or with SPLITK the first unit's slice
// (SFA_KB = ceil(KB / S)): the host then gives no CTA a second unit.
template <int KIND, bool FP8, int OUT, int CT, int N, int K, int BM, int BN, int STAGES, int EPI, int KSPLIT,
          int PIPE = 0, int MCAST = 0, int TSTORE = 0, int RS = 0, int SPLITK = 0, int SFA_ROWS = 0>
__device__ __forceinline__ void gemm_body(const TmaDesc& tma_a, const TmaDesc& tma_b, const TmaDesc& tma_sfa,
                                          const float* __restrict__ sfb, void* __restrict__ d_ptr,
                                          const void* __restrict__ c_ptr, const int* __restrict__ grouped,
                                          int M, int num_groups, int a_box_rows, int sfa_box,
                                          const TmaDesc* tma_d = nullptr, float* ws = nullptr, int* tile_ctr = nullptr) {
  constexpr int NUM_MATH_WG = KSPLIT ? 2 : BM / 64;
  constexpr int KSTEP = KSPLIT ? 2 : 1;
  static_assert(!KSPLIT || (FP8 && BM == 64 && K / 128 >= 2), "KSPLIT: FP8, BM = 64, >= 2 K blocks");
  // (with KSPLIT each warpgroup holds two of its own stages; split-K gets a depth of 2 only with <= 3 K blocks in
  // all, so a slice gives each warpgroup one block at most and no pair)
  static_assert(!PIPE || (FP8 && STAGES >= (KSPLIT && !SPLITK ? 4 : 2)), "PIPE: FP8, >= 2 stages (4 with KSPLIT)");
  static_assert(MCAST != 1 || (KIND == kDense && !KSPLIT && !PIPE && BN % 16 == 0), "MCAST 1: dense, no KSPLIT/PIPE, BN % 16 == 0");
  static_assert(MCAST != 2 || (KIND != kContiguous && (!PIPE || SPLITK)), "MCAST 2: dense or masked, no PIPE (but for SPLITK)");
  constexpr int B_HALF = BN / 2 * 128;  // MCAST: bytes of one CTA's half of the B tile (1024-aligned)
  constexpr int KEL = FP8 ? 128 : 64;  // elements per 128-byte K block
  constexpr int KB = K / KEL;
  constexpr int SF_KB = K / 128, SFB_NB = (N + 127) / 128;
  constexpr int NB = (N + BN - 1) / BN;
  constexpr int SFA_KB = SPLITK ? (SF_KB + SPLITK - 1) / SPLITK : SF_KB;
  using Plan = SmemPlan<FP8, K, BM, BN, STAGES, EPI, KSPLIT, TSTORE, SFA_ROWS, SFA_KB>;
  static_assert(!SFA_ROWS || (FP8 && KIND == kDense && SFA_ROWS % 4 == 0 && SFA_ROWS <= 256 && SFA_KB <= 256),
                "SFA_ROWS: FP8 dense, a multiple of 4 rows, <= 256 rows and K blocks (one TMA box)");
  static_assert(!TSTORE || (OUT == kOutBF16 && EPI == 1 && BN % 64 == 0),
                "TSTORE: BF16 output, staged epilogue, BN a multiple of 64");
  static_assert(EPI == 0 || OUT == kOutBF16, "staged epilogue is BF16-only");
  constexpr int A_BYTES = Plan::kABytes, B_BYTES = Plan::kBBytes, SFA_BYTES = Plan::kSFABytes;
  static_assert(BM == 64 || BM == 128, "BM");
  // FP8 BN = 256 ("wide" tile, DEEPGEMM_BN256): each consumer warpgroup multiplies its 64 rows by the two
  // 128-column halves of the B tile in turn (m64n128k32 WGMMAs into one 64-register temporary), so the
  // FP32 accumulator is 128 registers + 64 for the temporary; each half lies in exactly one B scale block
  constexpr bool WIDE = FP8 && BN == 256;
  // (FP8 BN = 192: tiles start on multiples of 64, so one spans two B scale blocks at most, as BN <= 128)
  static_assert(BN % 8 == 0 && (BN <= (FP8 ? 128 : 256) || WIDE || (FP8 && BN == 192)),
                "BN: a multiple of 8, <= 128 (FP8: a tile spans <= 2 B scale blocks), FP8 192 or 256");
  static_assert(!WIDE || (BM == 128 && !KSPLIT && !PIPE && !MCAST), "FP8 BN = 256: BM = 128, no KSPLIT/PIPE/MCAST");
  static_assert(!RS || WIDE, "RS (A from registers): the wide FP8 tile only");
  static_assert(K % KEL == 0, "K");
  static_assert(!SPLITK || (FP8 && KIND == kDense && EPI == 0 && MCAST != 1 && !TSTORE && !WIDE && SPLITK <= KB),
                "SPLITK: FP8 dense, direct epilogue, no MCAST 1/TSTORE/wide tile, S <= K blocks");
  // SPLITK with MCAST 2: the pair (2p, 2p + 1) of slice-major units lies in one slice when NB is even, so the two
  // CTAs of a cluster take adjacent N blocks of the same M block and K slice and share A's boxes
  static_assert(!(SPLITK && MCAST) || NB % 2 == 0, "SPLITK with MCAST 2: an even number of N blocks");
  constexpr int NU_ALL = NB * (SPLITK ? SPLITK : 1);  // SPLITK: scheduler units (slice-major: u = s * NB + n)

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  u32 base = smem_addr(smem_raw);
  const u32 pad = (1024 - (base & 1023)) & 1023;
  unsigned char* smem = smem_raw + pad;
  base += pad;
  const u32 sA = base, sB = sA + STAGES * A_BYTES, sT = sB + STAGES * B_BYTES;  // sT: TSTORE boxes
  const u32 sSFA = sT + (TSTORE ? Plan::kEpiBytes : 0);
  const u32 sfa_bar = sSFA + STAGES * SFA_BYTES + Plan::kSFAOnceBytes - 16;  // (SFA_ROWS only)
  const u32 bars = sSFA + STAGES * SFA_BYTES + Plan::kSFAOnceBytes;  // full[s] at bars + 8s, empty[s] at bars + 8(STAGES + s)
  const float* sfa_smem = reinterpret_cast<const float*>(smem + (sSFA - base));
  // [BM / 64][64][kPitch] (TSTORE: [BM / 64][BN / 64][64 rows x 128 B, swizzled])
  unsigned char* const tail = smem + (bars - base) + 16 * STAGES;
  unsigned char* epi_smem = TSTORE ? smem + (sT - base) : tail;
  float* red_smem = reinterpret_cast<float*>(tail + (TSTORE ? 0 : Plan::kEpiBytes));  // [BN / 2][128]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
  if (tid == 0) {
    require_dynamic_smem(Plan::kTotal);
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bars + 8 * s, 1);
      // one arrival per consumer warp (of both CTAs of the cluster with MCAST)
      mbar_init(bars + 8 * (STAGES + s), (KSPLIT ? 4 : NUM_MATH_WG * 4) * (MCAST ? 2 : 1));
    }
    if constexpr (SFA_ROWS > 0) mbar_init(sfa_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  if (warp == NUM_MATH_WG * 4 && lane == 0) {
    tma_prefetch(&tma_a);
    tma_prefetch(&tma_b);
    if (FP8) tma_prefetch(&tma_sfa);
  }
  grid_dep_launch();
  grid_dep_wait();
  __syncthreads();
  if constexpr (MCAST) cluster_sync();  // the peer's barriers are initialised before anyone signals them

  if (wg == NUM_MATH_WG) {
    // producer warpgroup: one thread streams K blocks of every tile of this CTA
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (warp == NUM_MATH_WG * 4 && lane == 0) {
      Scheduler<KIND, BM, NU_ALL, MCAST> sched(M, num_groups, grouped);
      int m_blk, n_blk, g;
      u32 it = 0;
      const u64 pol_b = l2_policy_b();
      while (sched.next(m_blk, n_blk, g)) {
        int kb_lo = 0, kb_hi = KB;  // SPLITK: this unit's slice of the K blocks
        if constexpr (SPLITK) {
          const int slice = n_blk / NB;
          n_blk -= slice * NB;
          kb_lo = slice * KB / SPLITK;
          kb_hi = (slice + 1) * KB / SPLITK;
        }
        const int a_row = (KIND == kMasked ? g * M : 0) + m_blk * BM;
        const int b_row = (KIND == kDense ? 0 : g * N) + n_blk * BN;
        const int sf_y0 = KIND == kMasked ? g * SF_KB : 0;
        if (SFA_ROWS > 0 && it == 0) {  // the first unit
          mbar_expect_tx(sfa_bar, sfa_box * SFA_KB * 4);
          tma_load_2d(sSFA, &tma_sfa, sfa_bar, 0, kb_lo);
        } else if (SFA_ROWS > 0 && SPLITK > 0) {
          __trap();  // a second unit: its slice's scales are not in the box (the host never launches so)
        }
        for (int kb = kb_lo; kb < kb_hi; ++kb, ++it) {
          const u32 s = it % STAGES, ph = (it / STAGES) & 1;
          const u32 full = bars + 8 * s, empty = bars + 8 * (STAGES + s);
          mbar_wait(empty, ph ^ 1);
          // A's box may be shorter than BM when M is (rows past it hold stale data: never stored)
          mbar_expect_tx(full, a_box_rows * 128 + B_BYTES + (FP8 && !SFA_ROWS ? sfa_box * 4 : 0));
          if constexpr (MCAST == 2) {  // a_box_rows is a multiple of 16 (host): 1024-aligned halves
            const int r = (int)(blockIdx.x & 1), half = a_box_rows / 2;
            tma_load_2d_mcast(sA + s * A_BYTES + r * half * 128, &tma_a, full, kb * KEL, a_row + r * half, 3);
          } else {
            tma_load_2d(sA + s * A_BYTES, &tma_a, full, kb * KEL, a_row);
          }
          if constexpr (MCAST == 1) {
            const int r = (int)(blockIdx.x & 1);
            tma_load_2d_mcast(sB + s * B_BYTES + r * B_HALF, &tma_b, full, kb * KEL, b_row + r * (BN / 2), 3);
          } else {
            tma_load_2d_b(sB + s * B_BYTES, &tma_b, full, kb * KEL, b_row, pol_b);
          }
          if (FP8 && !SFA_ROWS) tma_load_2d(sSFA + s * SFA_BYTES, &tma_sfa, full, m_blk * BM, sf_y0 + kb);
        }
      }
    }
    if constexpr (MCAST) cluster_sync();
    return;
  }

  // consumer warpgroups: rows [wrow*64, wrow*64+64) of the tile, K blocks kw, kw + KSTEP, ...
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int wrow = KSPLIT ? 0 : wg, kw = KSPLIT ? wg : 0;
  const int wwarp = warp % 4;
  const int r_in_wg = wwarp * 16 + lane / 4;  // this thread's rows: r_in_wg and r_in_wg + 8
  // A's scales of this thread's two rows in K block kb (stage s): SFA_ROWS: [kb - the unit's first][sfa_box], the
  // caller passing kb so (rows past the box, never stored, read its last row)
  auto a_scales = [&](int kb, u32 s, int m_blk_, float& sa0, float& sa1) {
    if constexpr (SFA_ROWS > 0) {
      const int r0 = m_blk_ * BM + wrow * 64 + r_in_wg, last = sfa_box - 1;
      const float* col = sfa_smem + kb * sfa_box;
      sa0 = col[r0 < last ? r0 : last];
      sa1 = col[r0 + 8 < last ? r0 + 8 : last];
    } else {
      sa0 = sfa_smem[s * BM + wrow * 64 + r_in_wg];
      sa1 = sfa_smem[s * BM + wrow * 64 + r_in_wg + 8];
    }
  };
  Scheduler<KIND, BM, NU_ALL, MCAST> sched(M, num_groups, grouped);
  int m_blk, n_blk, g;
  bool have = sched.next(m_blk, n_blk, g);
  // SPLITK: the unit's slice and its K blocks [kb_lo, kb_hi) (otherwise 0 and [0, KB))
  auto unit_split = [&](int& nb_, int& slice_) {
    slice_ = nb_ / NB;
    nb_ -= slice_ * NB;
  };
  int slice = 0;
  if constexpr (SPLITK) unit_split(n_blk, slice);
  // B's scales: a tile's columns [n0, n0 + BN) span scale blocks n0/128 and (maybe) n0/128 + 1;
  // they are read from global memory one K block ahead (the next tile's first during the last).
  const float* sfb_row0 = sfb;
  int sfb_step = 0;  // offset from block n0/128 to the next one (0 when the tile does not straddle)
  auto sfb_tile = [&](int nb_, int g_, const float*& row, int& step) {
    const int n0 = nb_ * BN, blk = n0 / 128;
    row = sfb + ((KIND == kDense ? 0 : g_) * SFB_NB + blk) * SF_KB;
    step = (blk + 1 < SFB_NB && n0 % 128 + BN > 128) ? SF_KB : 0;
  };
  float sb0_next = 0.f, sb1_next = 0.f;
  // SPLITK: B's scales of the unit's first run of 32 K blocks (lane j: block kb_lo + j), loaded a unit ahead
  float run0_b0 = 0.f, run0_b1 = 0.f;
  auto load_run = [&](const float* row, int step, int lo, int hi, int r, float& v0, float& v1) {
    const int idx = lo + (r << 5) + lane;
    if (idx < hi) { v0 = row[idx]; v1 = row[step + idx]; }
  };
  if (FP8 && have) {
    sfb_tile(n_blk, g, sfb_row0, sfb_step);
    sb0_next = sfb_row0[kw];
    sb1_next = sfb_row0[sfb_step + kw];
    if constexpr (SPLITK)
      load_run(sfb_row0, sfb_step, slice * KB / SPLITK, (slice + 1) * KB / SPLITK, 0, run0_b0, run0_b1);
  }
  // after B's first scales are requested, so that their latency and the box's overlap (waiting first cost short
  // GEMMs ~1 us: BENCHMARKS.md run 34e)
  if (SFA_ROWS > 0 && have) mbar_wait(sfa_bar, 0);
  u32 it = 0;
  while (have) {
    int nm_blk = 0, nn_blk = 0, ng = 0;
    const bool have_next = sched.next(nm_blk, nn_blk, ng);
    int nslice = 0;
    if constexpr (SPLITK) unit_split(nn_blk, nslice);
    const float* nrow = sfb_row0;
    int nstep = 0;
    if (FP8 && have_next) sfb_tile(nn_blk, ng, nrow, nstep);
    auto advance = [&] {  // on to the next tile (and its B scale rows / split-K slice)
      have = have_next; m_blk = nm_blk; n_blk = nn_blk; g = ng;
      sfb_row0 = nrow; sfb_step = nstep;
      if constexpr (SPLITK) slice = nslice;
    };
    const int boundary = 128 - (n_blk * BN) % 128;  // tile-local columns >= boundary use the 2nd scale
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;

    // scales of K block kb: B's were prefetched (sb*_next), A's come with the stage
    auto take_scales = [&](int kb, u32 s, float (&sc)[4]) {
      const float sb0 = sb0_next, sb1 = sb1_next;
      if constexpr (PIPE) {  // selects, not branches (nrow == sfb_row0 after the last tile)
        const bool same = kb + KSTEP < KB;
        const float* p = same ? sfb_row0 + kb + KSTEP : nrow + kw;
        const int st = same ? sfb_step : nstep;
        sb0_next = p[0]; sb1_next = p[st];
      } else if (kb + KSTEP < KB) {
        sb0_next = sfb_row0[kb + KSTEP]; sb1_next = sfb_row0[sfb_step + kb + KSTEP];
      } else if (have_next) {
        sb0_next = nrow[kw]; sb1_next = nrow[nstep + kw];
      }
      float sa0, sa1;
      a_scales(kb, s, m_blk, sa0, sa1);
      sc[0] = sa0 * sb0; sc[1] = sa1 * sb0; sc[2] = sa0 * sb1; sc[3] = sa1 * sb1;
    };
    auto promote = [&](const float (&t)[BN / 2], const float (&sc)[4]) {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const bool second = j * 8 + (lane % 4) * 2 >= boundary;
        const float t0 = second ? sc[2] : sc[0], t1 = second ? sc[3] : sc[1];
        acc[j * 4 + 0] += t[j * 4 + 0] * t0;
        acc[j * 4 + 1] += t[j * 4 + 1] * t0;
        acc[j * 4 + 2] += t[j * 4 + 2] * t1;
        acc[j * 4 + 3] += t[j * 4 + 3] * t1;
      }
    };
    auto release = [&](u32 s) {
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(bars + 8 * (STAGES + s));
        if constexpr (MCAST) mbar_arrive_cluster(bars + 8 * (STAGES + s), (blockIdx.x & 1) ^ 1);
      }
    };
    // waits for K block kb's stage and issues its 4 WGMMAs into t (one commit group)
    auto issue = [&](int kb, float (&t)[BN / 2], float (&sc)[4]) {
      const u32 s = (it + kb) % STAGES, ph = ((it + kb) / STAGES) & 1;
      mbar_wait(bars + 8 * s, ph);
      const u32 a_addr = sA + s * A_BYTES + wrow * 64 * 128, b_addr = sB + s * B_BYTES;
      if constexpr (FP8) take_scales(kb, s, sc);
      fence_regs(t);
      wgmma_fence();
      if constexpr (!WIDE) {  // (the wide tile issues its own halves)
#pragma unroll
        for (int k = 0; k < 4; ++k)
          Wgmma<BN, FP8>::mma(t, make_desc(a_addr + 32 * k), make_desc(b_addr + 32 * k), FP8 ? k : ((kb | k) != 0));
      }
      wgmma_commit();
    };
    if constexpr (!FP8) {
      // BF16: WGMMAs accumulate in place; keep one K block in flight, free the stage before it
      float sc[4];
      for (int kb = 0; kb < KB; ++kb) {
        issue(kb, acc, sc);
        if (kb > 0) {
          wgmma_wait<1>();
          release((it + kb - 1) % STAGES);
        }
      }
      wgmma_wait<0>();
      fence_regs(acc);
      release((it + KB - 1) % STAGES);
    } else if constexpr (WIDE) {
      // two 128-column halves per K block, one commit group each; the other consumer warpgroup's WGMMAs
      // keep the tensor cores busy while this one promotes. The tile starts on a multiple of 128, so
      // half h uses B scale sb_h (sc[2h], sc[2h + 1]) and no column boundary test is needed.
      // RS: A's 64 x 128 slice is read once per K block into registers (ldmatrix; 16 per thread) and
      // serves both halves, instead of each half's WGMMAs reading it from shared memory again.
      float t[64], sc[4];
      u32 af[4][4];
      // ldmatrix row of this lane: matrix i = lane / 8 holds rows (i % 2) * 8 + lane % 8 of the warp's 16
      // and 16-byte K chunk i / 2 of the 32-byte K step (register i of the WGMMA A fragment)
      const u32 lrow = (u32)(wwarp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)), lhi = (u32)(lane >> 4);
      for (int kb = 0; kb < KB; ++kb) {
        const u32 s = (it + kb) % STAGES, ph = ((it + kb) / STAGES) & 1;
        mbar_wait(bars + 8 * s, ph);
        const u32 a_addr = sA + s * A_BYTES + wrow * 64 * 128, b_addr = sB + s * B_BYTES;
        take_scales(kb, s, sc);
        if constexpr (RS) {  // 128-byte swizzle: chunk c of row r at (c ^ r % 8) * 16; lrow % 8 == lane % 8
#pragma unroll
          for (int k = 0; k < 4; ++k) ldsm_x4(af[k], a_addr + lrow * 128 + ((((u32)(2 * k) + lhi) ^ (lane & 7)) << 4));
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          fence_regs(t);
          if constexpr (RS) {
#pragma unroll
            for (int k = 0; k < 4; ++k) fence_regs(af[k]);
          }
          wgmma_fence();
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            if constexpr (RS) WgmmaRS<BN / 2>::mma(t, af[k], make_desc(b_addr + h * 128 * 128 + 32 * k), k);
            else Wgmma<BN / 2, FP8>::mma(t, make_desc(a_addr + 32 * k), make_desc(b_addr + h * 128 * 128 + 32 * k), k);
          }
          wgmma_commit();
          wgmma_wait<0>();
          fence_regs(t);
          if constexpr (RS) {
#pragma unroll
            for (int k = 0; k < 4; ++k) fence_regs(af[k]);
          }
          if (h == 1) release(s);
          const float s0 = sc[2 * h], s1 = sc[2 * h + 1];
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            acc[h * 64 + j * 4 + 0] += t[j * 4 + 0] * s0;
            acc[h * 64 + j * 4 + 1] += t[j * 4 + 1] * s0;
            acc[h * 64 + j * 4 + 2] += t[j * 4 + 2] * s1;
            acc[h * 64 + j * 4 + 3] += t[j * 4 + 3] * s1;
          }
        }
      }
    } else if constexpr (SPLITK) {
      // this unit's K blocks [kb_lo, kb_hi) (this warpgroup's: every KSTEP-th from kb_lo + kw); block kb is
      // pipeline step itb + kb. B's scales: lane j of every warp holds those of block kb_lo + 32c + j for the
      // unit's c-th run of 32 blocks, and each block takes its pair by a shuffle, so the K loop does not wait
      // on one global load per block (a small-M K block is far shorter than an L2 round trip). The runs are
      // loaded one ahead: run 0 during the previous unit (or before the first), run c + 1 when run c starts.
      // PIPE: the blocks go in pairs, the second's WGMMAs running while the first is promoted (straight-line
      // within a pair, so ptxas keeps both commit groups in flight; an odd last block goes alone).
      const int kb_lo = slice * KB / SPLITK, kb_hi = (slice + 1) * KB / SPLITK;
      const u32 itb = it - (u32)kb_lo;
      float sbv0 = run0_b0, sbv1 = run0_b1, nbv0 = 0.f, nbv1 = 0.f;
      load_run(sfb_row0, sfb_step, kb_lo, kb_hi, 1, nbv0, nbv1);
      int run = 0;
      // waits for block kb's stage, takes its scales and issues its 4 WGMMAs into t (one commit group);
      // returns the stage
      auto issue_blk = [&](int kb, float (&t)[BN / 2], float (&sc)[4]) {
        const int j = kb - kb_lo;
        if ((j >> 5) != run) {  // (one run at a time: KSTEP <= 32)
          run = j >> 5;
          sbv0 = nbv0; sbv1 = nbv1;
          load_run(sfb_row0, sfb_step, kb_lo, kb_hi, run + 1, nbv0, nbv1);
        }
        const float sb0 = shfl_idx(sbv0, j & 31), sb1 = shfl_idx(sbv1, j & 31);
        const u32 s = (itb + kb) % STAGES, ph = ((itb + kb) / STAGES) & 1;
        mbar_wait(bars + 8 * s, ph);
        const u32 a_addr = sA + s * A_BYTES + wrow * 64 * 128, b_addr = sB + s * B_BYTES;
        float sa0, sa1;
        a_scales(SFA_ROWS ? j : kb, s, m_blk, sa0, sa1);
        sc[0] = sa0 * sb0; sc[1] = sa1 * sb0; sc[2] = sa0 * sb1; sc[3] = sa1 * sb1;
        fence_regs(t);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) Wgmma<BN, FP8>::mma(t, make_desc(a_addr + 32 * k), make_desc(b_addr + 32 * k), k);
        wgmma_commit();
        return s;
      };
      auto retire_blk = [&](u32 s, float (&t)[BN / 2], const float (&sc)[4]) {
        fence_regs(t);
        release(s);
        promote(t, sc);
      };
      float t[BN / 2], sc[4];
      int kb = kb_lo + kw;
      if constexpr (PIPE) {
        float t1[BN / 2], sc1[4];
        kb = pairs_in_flight(kb, kb_hi, KSTEP, issue_blk, retire_blk, t, t1, sc, sc1);
      }
      for (; kb < kb_hi; kb += KSTEP) {
        const u32 s = issue_blk(kb, t, sc);
        wgmma_wait<0>();
        retire_blk(s, t, sc);
      }
      it += (u32)(kb_hi - kb_lo) - KB;  // (KB is added below)
      if (have_next)  // the next unit's first run, in flight during this unit's epilogue
        load_run(nrow, nstep, nslice * KB / SPLITK, (nslice + 1) * KB / SPLITK, 0, run0_b0, run0_b1);
    } else if constexpr (!PIPE) {
      float t[BN / 2], sc[4];
      for (int kb = kw; kb < KB; kb += KSTEP) {
        issue(kb, t, sc);
        wgmma_wait<0>();
        fence_regs(t);
        release((it + kb) % STAGES);
        promote(t, sc);
      }
    } else {
      constexpr int CH = KB % 4 == 0 ? 4 : KB % 2 == 0 ? 2 : 1;  // short chunks: fewer live addresses
      auto retire = [&](int kb, float (&t)[BN / 2], const float (&sc)[4]) {
        fence_regs(t);
        release((it + kb) % STAGES);
        promote(t, sc);
      };
      if constexpr (KSPLIT) {  // this warpgroup's blocks kw, kw + 2, ... in pairs
        float t0[BN / 2], t1[BN / 2], sc0[4], sc1[4];
        auto issue_kb = [&](int kb, float (&t)[BN / 2], float (&sc)[4]) {
          issue(kb, t, sc);
          return kb;
        };
        const int kb = pairs_in_flight(kw, KB, KSTEP, issue_kb, retire, t0, t1, sc0, sc1);
        if (kb < KB) {
          issue(kb, t0, sc0);
          wgmma_wait<0>();
          retire(kb, t0, sc0);
        }
      } else {
        for (int c0 = 0; c0 < KB; c0 += CH) {
          float t0[BN / 2], t1[BN / 2], sc0[4], sc1[4];
          two_in_flight<CH>(c0, issue, retire, t0, t1, sc0, sc1);
        }
      }
    }
    it += KB;
    if constexpr (KSPLIT) {
      // warpgroup 1 hands its partial sums to warpgroup 0, which writes the tile
      const int wtid = tid % 128;
      named_bar_sync(3, 256);  // warpgroup 0 has consumed the previous tile's partial sums
      if (wg == 1) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) red_smem[i * 128 + wtid] = acc[i];
        asm volatile("bar.arrive 4, 256;" ::: "memory");
      } else {
        named_bar_sync(4, 256);
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] += red_smem[i * 128 + wtid];
      }
    }

    // epilogue: rows/cols bounds-checked (N % 8 == 0 is required on the host)
    if (KSPLIT && wg == 1) {
      advance();
      continue;
    }
    if constexpr (SPLITK) {
      // cross-CTA split-K (see above gemm_body): the ET epilogue threads (tid < ET) hold the tile
      constexpr int ET = (KSPLIT ? 1 : NUM_MATH_WG) * 128, TILE_F = BM * BN;
      const int tile = m_blk * NB + n_blk;
      float* const slots = ws + (long long)tile * SPLITK * TILE_F;
      float* const mine = slots + (long long)slice * TILE_F + tid;
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) st_cg(mine + i * ET, acc[i]);
      __threadfence();
      named_bar_sync(5, ET);  // every epilogue thread's partial is written and fenced
      u32 last = 0;
      if (tid == 0) {
        last = atomicAdd(tile_ctr + tile, 1) == SPLITK - 1;
        if (last) atomicExch(tile_ctr + tile, 0);  // every unit of the tile has arrived: ready for the next launch
        __threadfence();
      }
      if (!bar_red_or(5, ET, last)) {  // not the last unit of the tile: nothing more to do for it
        advance();
        continue;
      }
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[i] = ld_cg(slots + i * ET + tid);
      for (int s = 1; s < SPLITK; ++s) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] += ld_cg(slots + (long long)s * TILE_F + i * ET + tid);
      }
    }
    int limit;
    long long row_off;
    valid_rows<KIND>(grouped, g, M, limit, row_off);
    const int row_wg = m_blk * BM + wrow * 64;  // first row of this warpgroup's 64
    const int col_t = n_blk * BN;
    // contiguous: bit r set when row row_wg + r is below M and in a group (padding rows, m_indices < 0, are not
    // written); m_indices read once per tile, not once per stored chunk (each store then waited for its load)
    unsigned long long grp_rows = ~0ull;
    if constexpr (KIND == kContiguous) {
      const bool ok0 = row_wg + lane < limit && grouped[row_wg + lane] >= 0;
      const bool ok1 = row_wg + 32 + lane < limit && grouped[row_wg + 32 + lane] >= 0;
      grp_rows = __ballot_sync(~0u, ok0) | (unsigned long long)__ballot_sync(~0u, ok1) << 32;
    }
    auto store_direct = [&]() {  // each thread its own elements, straight to global memory
      const int col0 = col_t + (lane % 4) * 2;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = row_wg + r_in_wg + half * 8;
        if (r >= limit) continue;
        if (KIND == kContiguous && !(grp_rows >> (r_in_wg + half * 8) & 1)) continue;
        const long long off = (row_off + r) * (long long)N;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int col = col0 + j * 8;
          if (col >= N) continue;
          float v0 = acc[j * 4 + half * 2], v1 = acc[j * 4 + half * 2 + 1];
          add_c<CT>(c_ptr, off + col, v0, v1);
          if (OUT == kOutBF16) {
            *reinterpret_cast<u32*>(reinterpret_cast<unsigned short*>(d_ptr) + off + col) = pack_bf16(v0, v1);
          } else if (OUT == kOutF32) {
            *reinterpret_cast<Float2*>(reinterpret_cast<float*>(d_ptr) + off + col) = Float2{v0, v1};
          } else {
            *reinterpret_cast<unsigned short*>(reinterpret_cast<unsigned char*>(d_ptr) + off + col) = pack_fp8(v0, v1);
          }
        }
      }
    };
    // TSTORE writes whole 64-row boxes: dense ones are clipped at M by the TMA unit; a grouped box goes out
    // by TMA only if every row of it may be written (inside the group's masked_m; no padding row), else by
    // store_direct. Uniform over the warpgroup: every warp reads the same 64 entries.
    bool whole_box = true;
    if constexpr (TSTORE && KIND != kDense) {
      whole_box = row_wg + 64 <= limit;
      if (KIND == kContiguous) whole_box = grp_rows == ~0ull;
    }
    if (TSTORE && !whole_box) {
      store_direct();
    } else if constexpr (TSTORE) {
      // registers -> one swizzled 64 x 64 box per 64-column pass -> TMA store (clipped at M and N); the
      // warpgroup goes on to the next tile while the TMA engine writes this one out
      constexpr int PASSES = BN / 64;
      unsigned char* buf = epi_smem + wrow * PASSES * 8192;
      const int wtid = tid % 128;
      if (wtid == 0) bulk_wait_read_all();  // the previous tile's stores have read buf
      named_bar_sync(1 + wrow, 128);
#pragma unroll
      for (int pass = 0; pass < PASSES; ++pass) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = r_in_wg + half * 8;  // r % 8 == lane / 4
          const bool row_ok = row_wg + r < limit;
#pragma unroll
          for (int j = 0; j < 8; ++j) {  // 16-byte chunk j of the 128-byte row
            const int jj = pass * 8 + j, c = jj * 8 + (lane % 4) * 2;
            float v0 = acc[jj * 4 + half * 2], v1 = acc[jj * 4 + half * 2 + 1];
            if (CT != kNoC && row_ok && col_t + c < N)
              add_c<CT>(c_ptr, (row_off + row_wg + r) * (long long)N + col_t + c, v0, v1);
            *reinterpret_cast<u32*>(buf + pass * 8192 + r * 128 + ((j ^ (lane / 4)) * 16) + (lane % 4) * 4) =
                pack_bf16(v0, v1);
          }
        }
      }
      fence_proxy_async();
      named_bar_sync(1 + wrow, 128);
      if (wtid == 0) {
#pragma unroll
        for (int pass = 0; pass < PASSES; ++pass)
          tma_store_2d(tma_d, smem_addr(buf) + pass * 8192, col_t + pass * 64, (int)row_off + row_wg);
        bulk_commit();
      }
    } else if constexpr (EPI == 1) {
      constexpr int P = Plan::kPitch, EW = Plan::kEW;
      unsigned char* buf = epi_smem + wrow * 64 * P;
      // one pass of EW columns from tile column cp0: registers -> buf -> 16-byte global stores
      auto epi_pass = [&](const int cp0) {
        named_bar_sync(1 + wrow, 128);  // the previous copy-out has finished reading buf
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = r_in_wg + half * 8;
          const bool row_ok = row_wg + r < limit;
#pragma unroll
          for (int j = 0; j < EW / 8; ++j) {
            const int c = j * 8 + (lane % 4) * 2;  // column within the pass
            const int jj = cp0 / 8 + j;
            float v0 = acc[jj * 4 + half * 2], v1 = acc[jj * 4 + half * 2 + 1];
            if (CT != kNoC && row_ok && col_t + cp0 + c < N)
              add_c<CT>(c_ptr, (row_off + row_wg + r) * (long long)N + col_t + cp0 + c, v0, v1);
            *reinterpret_cast<u32*>(buf + r * P + c * 2) = pack_bf16(v0, v1);
          }
        }
        named_bar_sync(1 + wrow, 128);
        constexpr int CH = EW / 8;  // 16-byte chunks per row
        const int wtid = tid % 128;
        for (int idx = wtid; idx < 64 * CH; idx += 128) {
          const int r = idx / CH, ch = idx - r * CH;
          const int row = row_wg + r, col = col_t + cp0 + ch * 8;
          if (row >= limit || col >= N) continue;
          if (KIND == kContiguous && !(grp_rows >> r & 1)) continue;
          const Vec16 v = *reinterpret_cast<const Vec16*>(buf + r * P + ch * 16);
          *reinterpret_cast<Vec16*>(reinterpret_cast<unsigned short*>(d_ptr) + (row_off + row) * (long long)N + col) = v;
        }
      };
      if constexpr (EW == BN) {
        epi_pass(0);
      } else {
#pragma unroll
        for (int pass = 0; pass < BN / EW; ++pass) epi_pass(pass * EW);
      }
    } else {
      store_direct();
    }
    advance();
  }
  if constexpr (TSTORE) {
    if (tid % 128 == 0) bulk_wait_all();  // the CTA's shared memory must outlive its TMA stores
  }
  if constexpr (MCAST) cluster_sync();
}

}  // namespace dg
