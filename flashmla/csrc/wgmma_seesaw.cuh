// The BF16 wgmma kernel's seesaw consumers (FLASHMLA_WGMMA_SEESAW=1; included by mla_decode_wgmma.cu
// after wgmma_common.cuh). Both consumer warpgroups own half of O (WG1 columns 0..255, WG2 256..511)
// and take a request's pages in turns: page j (j counted from the request's first page in this
// part) is owned by warpgroup j & 1, which runs S_j, the softmax and publishes P_j (bf16 hi plane in
// the page's RoPE slab, lo plane in P_lo for hi/lo requests) and the running row max m_j (sM) behind
// named barrier PF[j & 1]; the other warpgroup syncs there, rescales its half of O and l by
// alpha_j = 2^(m_{j-1} - m_j) (it keeps m_{j-1} itself) and adds P_j V_j. So one warpgroup's softmax
// runs beside the other's tensor work instead of in front of it. Own step j of a warpgroup:
//   wait full[j-1] (j >= 1) and full[j], issue S_j; (j >= 1) sync PF[j-1], issue P V of page j-1;
//   wait_group 1 (S_j done); softmax of S_j; P_j and m_j out, arrive PF[j]; wait_group 0 (P V of
//   j-1 done) -> its stage released; O rescaled; issue P V of page j; wait_group 0 -> page j's stage
//   released. hi/lo pages (one P_lo buffer): the wait for P V of j-1 and its release come before P_j,
//   and P_j waits on PE (the other warpgroup done with P_lo of j-1). So the chain from one
//   warpgroup's P_j to the other's P_{j+1} holds no tensor-core wait. No wgmma is waited or issued
//   under a branch or in flight across one (ptxas would serialise every wgmma: C7514-C7520); the one
//   wait ptxas adds (C7517) is before apply_other's rescale, while S_j runs.
// Epilogue: partial row sums l of each warpgroup through sL[2][64] between two syncs (EPI0, EPI1);
// WG1 writes lse. q_empty takes 256 arrivals: each warpgroup after its last S of the request (or at
// its start when it owns no page). CPU model of this protocol: csrc/models/seesaw_protocol_model.py.
#pragma once

namespace flashmla {
namespace {

constexpr int BAR_WG2_ONLY = 8;  // WG2's own P stores before its P V (WG1 uses BAR_WG1_ONLY)

template <bool ZERO_TAIL>
__device__ __forceinline__ void run_consumers_seesaw(const DecodeArgs& a, const CtaPart& c) {
  const uint32_t uQ = c.uQ, uK = c.uK, uPlo = c.uPlo, uBar = c.uBar, bar_qfull = c.bar_qfull, bar_qempty = c.bar_qempty;
  float* sM = c.sAlpha;  // [64] running row max of the last published page
  float* sL = c.sInv;    // [2][64] partial row sums of each warpgroup
  const int m = c.m, t = c.t, row_base = c.row_base;
  const int b0 = c.b0, k0 = c.k0, b1 = c.b1, k1 = c.k1, first = c.first, last = c.last;
  const int lane = t & 31, gq = lane >> 2, cq = lane & 3;
  const int r_loc[2] = {(t >> 5) * 16 + gq, (t >> 5) * 16 + gq + 8};
  const float scale_log2 = a.softmax_scale * LOG2E;
  int it = 0, qn = 0;

  for (int b = b0; b <= last && b < a.batch; ++b) {
    const Work wk = request_work(a, b, b0, k0, b1, k1, first);
    if (wk.split && wk.g >= a.batch + a.parts) break;
    const int npg = wk.kend - wk.kbeg;

    // one copy per P precision and warpgroup (W), so that no wgmma sits behind a branch on a value ptxas
    // cannot prove warpgroup-uniform (a run-time w serialises every wgmma: ptxas C7518)
    auto body = [&](auto lo_tag, auto w_tag) {
      constexpr bool LO = decltype(lo_tag)::value;
      constexpr int w = decltype(w_tag)::value, own_bar = w == 0 ? BAR_WG1_ONLY : BAR_WG2_ONLY;
      float o[2][64];  // O[64 x 256] of this warpgroup, columns 256 w ..
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int i = 0; i < 64; ++i) o[j][i] = 0.f;
      float mprev[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.f, 0.f};
      int lim[2];
      key_limits(a, wk, row_base, r_loc, m, lim);
      auto stage = [&](int j) { return uK + ((it + j) & 1) * TILE; };
      // alpha of a page whose running max is mn, from the previous one (mprev); mprev and l follow (O is
      // rescaled by the caller, once no P V of this warpgroup is in flight)
      auto advance = [&](const float (&mn)[2], float (&muse)[2], float (&al)[2]) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          muse[h] = mn[h] == NEG_INF ? 0.f : mn[h];
          al[h] = exp2_ftz(mprev[h] - muse[h]);
          mprev[h] = mn[h];
          lrow[h] *= al[h];
        }
      };
      auto issue_pv = [&](int j) { issue_pv_page<LO>(o, stage(j), 4 * w, uPlo); };
      auto wait_all = [&]() { wait_pv(o); };
      auto release = [&](int j) {  // this warpgroup's P V of page j is complete
        mbar_arrive(uBar + 16 + 8 * ((it + j) & 1));
        if (LO && j + 1 < npg && (j & 1) == w) bar_arrive(BAR_P_EMPTY, 256);
      };
      auto wait_full = [&](int j) { mbar_wait(uBar + 8 * ((it + j) & 1), ((it + j) >> 1) & 1); };
      // the other warpgroup's page j: rescale, P V. The caller has waited for full[j] itself (which makes
      // the TMA bytes visible to this warpgroup) before any wgmma was in flight: an mbarrier poll loop
      // while S runs serialises every wgmma of the kernel (ptxas C7518)
      auto apply_other = [&](int j) {
        bar_sync(bar_p_full(j), 256);
        const float mn[2] = {sM[r_loc[0]], sM[r_loc[1]]};
        float muse[2], al[2];
        advance(mn, muse, al);
        rescale_if_moved(o, al);
        issue_pv(j);
      };

      if (npg > 0) mbar_wait(bar_qfull, qn & 1);
      qn += npg > 0;
      const int last_own = npg - 1 - (((npg - 1) & 1) != w);  // < 0: owns no page
      if (npg > 0 && last_own < 0) mbar_arrive(bar_qempty);
      // one own page j; FIRST: page 0 (warpgroup 1's first), which has no previous page to apply
      auto own_step = [&](int j, auto first_tag) {
        constexpr bool FIRST = decltype(first_tag)::value;
        const int blk = wk.kbeg + j;
        const uint32_t uKs = stage(j);
        if (!FIRST) wait_full(j - 1);
        wait_full(j);
        // rows past the request's length hold arbitrary data: zero them in the V slabs before any P V
        // reads them (S masks them anyway); made visible by the fence and barriers before P V
        if (ZERO_TAIL && blk == wk.nb - 1 && (wk.L & (PAGE - 1))) zero_v_tail(uKs, wk.L & (PAGE - 1), t);
        float sacc[32];
        issue_s(uQ, uKs, sacc);
        if constexpr (FIRST) {
          wgmma_wait0();
        } else {
          apply_other(j - 1);
          wgmma_wait1();
        }
        fence_regs(sacc);
        if (j == last_own) mbar_arrive(bar_qempty);
        float mx[2] = {mprev[0], mprev[1]};  // the row max with the previous page's
        scale_mask_max(sacc, blk, cq, lim, scale_log2, mx);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        }
        // P V of page j - 1 done: its stage can go. With one P_lo buffer (hi/lo) this comes before P_j is
        // written; otherwise after P_j is out, so that the next softmax waits on this one only
        auto pv_prev_done = [&]() {
          wait_all();
          if (!FIRST) release(j - 1);
        };
        if constexpr (LO) pv_prev_done();
        float muse[2], al[2];
        advance(mx, muse, al);
        if (LO && !FIRST) bar_sync(BAR_P_EMPTY, 256);  // the other warpgroup is done with P_lo of page j - 1
        write_p_planes<LO>(uKs + 8 * SLAB, uPlo, sacc, muse, r_loc, cq, lrow);
        if (cq == 0) {
          sM[r_loc[0]] = mx[0];
          sM[r_loc[1]] = mx[1];
        }
        fence_async_smem();
        bar_arrive(bar_p_full(j), 256);
        if constexpr (!LO) pv_prev_done();
        rescale_if_moved(o, al);
        bar_sync(own_bar, 128);
        issue_pv(j);
        // waited here rather than at the next own step, which needs page j's stage for page j + 2 anyway:
        // no wgmma in flight across a branch or a join (ptxas serialises every wgmma otherwise, C7514-C7520)
        wait_all();
        release(j);
      };
      // (loops rather than ifs around the steps, for the same reason)
      if constexpr (w == 0)
        for (int j = 0; j < min(npg, 1); ++j) own_step(j, std::true_type{});
      for (int j = w == 0 ? 2 : 1; j < npg; j += 2) own_step(j, std::false_type{});
      // the other warpgroup's last page comes after this one's last own page: apply it (a loop of at most
      // one page rather than an if: C7520 otherwise)
      for (int j = (npg > 0 && ((npg - 1) & 1) != w) ? npg - 1 : npg; j < npg; ++j) {
        wait_full(j);
        apply_other(j);
        wait_all();
        release(j);
      }

      // ---- epilogue: l = both warpgroups' partial sums; WG1 writes lse
      float inv[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        lrow[h] += __shfl_xor_sync(0xffffffffu, lrow[h], 1);
        lrow[h] += __shfl_xor_sync(0xffffffffu, lrow[h], 2);
      }
      if (npg > 0) {
        if (cq == 0) {
          sL[w * BM + r_loc[0]] = lrow[0];
          sL[w * BM + r_loc[1]] = lrow[1];
        }
        bar_sync(BAR_EPI0, 256);
        lrow[0] += sL[(1 - w) * BM + r_loc[0]];
        lrow[1] += sL[(1 - w) * BM + r_loc[1]];
        bar_sync(BAR_EPI1, 256);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) inv[h] = lrow[h] > 0.f ? 1.f / lrow[h] : 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rg = row_base + r_loc[h];
        if (rg < m) store_row(a, wk, b, m, rg, 256 * w + 2 * cq, o, h, inv[h], w == 0 && cq == 0, mprev[h], lrow[h]);
      }
      it += max(npg, 0);
    };
    using WG1 = std::integral_constant<int, 0>;
    using WG2 = std::integral_constant<int, 1>;
    const bool lo = wk.L < a.p_bf16_min_keys;
    if (c.wg == 1) {
      if (lo) body(std::true_type{}, WG1{});
      else body(std::false_type{}, WG1{});
    } else {
      if (lo) body(std::true_type{}, WG2{});
      else body(std::false_type{}, WG2{});
    }
  }
}

}  // namespace
}  // namespace flashmla
