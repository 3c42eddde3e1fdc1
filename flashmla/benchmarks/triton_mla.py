"""A Triton split-KV MLA decode baseline (peer for bench_decode.py; not part of the library).

The straightforward Triton design: one program per (request, block of 16 query rows, split of the
keys); each walks its key range in blocks of 32 through the block table, S = q·kᵀ as two dots
(512 NoPE + 64 RoPE columns), online softmax, acc += p·v; a few torch ops merge the splits.
Shapes as flash_mla_with_kvcache (bf16 q [b, s_q, h_q, 576], cache [pages, 64, 1, 576]).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _split_kernel(Q, KC, BT, SL, OP, LP, stride_kpage, stride_bt, m, h_q, s_q, num_splits,
                  scale_log2, CAUSAL: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    L = tl.sum(tl.load(SL + b + tl.arange(0, 1)), 0)  # scalar (also under TRITON_INTERPRET)
    rows = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    rmask = rows < m
    dv = tl.arange(0, 512)
    dr = tl.arange(0, 64)
    qrow = Q + b.to(tl.int64) * m * 576 + rows[:, None] * 576
    q_nope = tl.load(qrow + dv[None, :], mask=rmask[:, None], other=0.0)
    q_pe = tl.load(qrow + 512 + dr[None, :], mask=rmask[:, None], other=0.0)
    per_split = tl.cdiv(tl.cdiv(L, BLOCK_N), num_splits) * BLOCK_N
    start = sp * per_split
    end = tl.minimum(start + per_split, L)
    if CAUSAL:
        lim = L - s_q + 1 + rows // h_q
    else:
        lim = L + rows * 0
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, 512], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        valid = offs < end
        page = tl.load(BT + b.to(tl.int64) * stride_bt + offs // 64, mask=valid, other=0)
        kbase = KC + page.to(tl.int64) * stride_kpage + (offs % 64) * 576
        k_nope = tl.load(kbase[:, None] + dv[None, :], mask=valid[:, None], other=0.0)
        k_pe = tl.load(kbase[:, None] + 512 + dr[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q_nope, tl.trans(k_nope)) + tl.dot(q_pe, tl.trans(k_pe))
        keep = (offs[None, :] < lim[:, None]) & valid[None, :]
        s = tl.where(keep, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k_nope.dtype), k_nope)
        m_i = m_new
    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    base = (b * num_splits + sp).to(tl.int64) * m
    tl.store(OP + (base + rows[:, None]) * 512 + dv[None, :], o, mask=rmask[:, None])
    tl.store(LP + base + rows, lse, mask=rmask)


def triton_mla_decode(q, k_cache, block_table, cache_seqlens, softmax_scale=None, causal=False,
                      num_splits=None):
    """Returns out bf16 [b, s_q, h_q, 512] and lse fp32 [b, h_q, s_q] (+inf for empty rows)."""
    b, s_q, h_q, d = q.shape
    m = s_q * h_q
    block_h, block_n = 16, 32
    hblocks = triton.cdiv(m, block_h)
    if num_splits is None:
        num_splits = max(1, min(16, math.ceil(2 * 132 / (b * hblocks))))
    scale = (softmax_scale or d ** -0.5) * 1.4426950408889634
    op = torch.empty(b, num_splits, m, 512, dtype=torch.float32, device=q.device)
    lp = torch.empty(b, num_splits, m, dtype=torch.float32, device=q.device)
    _split_kernel[(b, hblocks, num_splits)](
        q, k_cache, block_table, cache_seqlens, op, lp, k_cache.stride(0), block_table.stride(0),
        m, h_q, s_q, num_splits, scale, CAUSAL=bool(causal), BLOCK_H=block_h, BLOCK_N=block_n,
        num_warps=4, num_stages=2)
    mx = lp.amax(dim=1, keepdim=True)                                  # [b, 1, m]
    mxs = torch.where(torch.isneginf(mx), torch.zeros_like(mx), mx)
    w = torch.exp(lp - mxs)                                            # 0 for empty splits
    tot = w.sum(dim=1)                                                 # [b, m]
    out = (w.unsqueeze(-1) * op).sum(dim=1) / tot.clamp_min(1e-30).unsqueeze(-1)
    lse = torch.where(tot > 0, mxs.squeeze(1) + torch.log(tot), torch.full_like(tot, math.inf))
    out = out.view(b, s_q, h_q, 512).to(q.dtype)
    return out, lse.view(b, s_q, h_q).transpose(1, 2)
