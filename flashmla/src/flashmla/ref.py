"""Plain-PyTorch oracle: MLA decoding attention over a paged KV cache, and the tile scheduler.

Both functions here are the CPU path of the public API and the oracle the CUDA kernels are tested
against. They favour clarity over speed (a Python loop over the batch, float32 math).
"""
from __future__ import annotations

import math

import torch

PAGE_SIZE = 64          # tokens per page of the KV cache
SEG_OVERHEAD = 5        # scheduler cost of a segment (a request or a piece of one), in pages; the
                        # default of get_mla_metadata, FLASHMLA_SPLIT_OVH=c overrides it
META_SIZE = 8           # int32 words per row of tile_scheduler_metadata


def mla_decode_ref(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                   cache_seqlens: torch.Tensor, head_dim_v: int, softmax_scale: float | None = None,
                   causal: bool = False, v_cache: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference MLA decode in float32.

    q:            [batch, s_q, h_q, d]                 (any float dtype)
    k_cache:      [num_blocks, page, h_kv, d]          V is k_cache[..., :head_dim_v]
    block_table:  int [batch, max_blocks]              page ids of each request, in order
    cache_seqlens:int [batch]                          keys of each request (0 allowed)
    Returns out float32 [batch, s_q, h_q, head_dim_v] and lse float32 [batch, h_q, s_q]
    (natural log). A query row that sees no key gets out = 0 and lse = +inf. With causal=True
    and s_q > 1, query i (0-based) of a request with L keys sees keys [0, L - s_q + i], the
    bottom-right aligned mask. v_cache (optional, same pages as k_cache, [..., >= head_dim_v]): the values
    from it instead of from k_cache (a kernel's own view of V, e.g. flashmla.testing.rf_values).
    """
    batch, s_q, h_q, d = q.shape
    page, h_kv = k_cache.shape[1], k_cache.shape[2]
    if softmax_scale is None:
        softmax_scale = d ** -0.5
    group = h_q // h_kv
    out = torch.zeros(batch, s_q, h_q, head_dim_v, dtype=torch.float32, device=q.device)
    lse = torch.full((batch, h_q, s_q), math.inf, dtype=torch.float32, device=q.device)
    seqlens = cache_seqlens.tolist()
    for b in range(batch):
        L = int(seqlens[b])
        if L == 0:
            continue
        pages = block_table[b, : (L + page - 1) // page].long()
        kv = k_cache[pages].reshape(-1, h_kv, d)[:L].float()          # [L, h_kv, d]
        qb = q[b].float().view(s_q, h_kv, group, d)                     # [s_q, h_kv, g, d]
        s = torch.einsum("qkgd,lkd->kgql", qb, kv) * softmax_scale      # [h_kv, g, s_q, L]
        if causal:
            limit = L - s_q + 1 + torch.arange(s_q, device=q.device)    # keys visible per query
            keep = torch.arange(L, device=q.device)[None, :] < limit[:, None]
            s = s.masked_fill(~keep, -math.inf)
        m = s.amax(dim=-1, keepdim=True)
        empty = torch.isneginf(m)                                       # rows that see no key
        p = torch.exp(s - torch.where(empty, torch.zeros_like(m), m))
        denom = p.sum(dim=-1, keepdim=True)
        p = p / torch.where(empty, torch.ones_like(denom), denom)
        vv = kv if v_cache is None else v_cache[pages].reshape(-1, h_kv, v_cache.shape[-1])[:L].float()
        o = torch.einsum("kgql,lkd->qkgd", p, vv[..., :head_dim_v])     # [s_q, h_kv, g, dv]
        out[b] = o.reshape(s_q, h_q, head_dim_v)
        lse[b] = torch.where(empty, torch.full_like(m, math.inf),
                             m + torch.log(denom)).reshape(h_q, s_q)
    return out, lse


def num_sm_parts_for(num_sms: int, num_q_tokens_per_head_k: int, num_heads_k: int) -> int:
    """How many scheduler parts (one CTA column each) get_mla_metadata makes: SMs / h_kv / m-blocks."""
    m_blocks = max(1, -(-num_q_tokens_per_head_k // 64))
    return max(1, num_sms // max(1, num_heads_k) // m_blocks)


def _pages(cache_seqlens) -> list[int]:
    """Pages of each request (ceil(length / 64))."""
    return [(int(L) + PAGE_SIZE - 1) // PAGE_SIZE for L in cache_seqlens.tolist()]


def _fill(nb: list[int], num_parts: int, c: int, budget: int):
    """Greedy fill of parts in request order with at most `budget` per part, where a part's load is
    its pages plus c per segment (a request or a piece of one) it holds. A request that does not fit
    whole is split if at least one page fits (the rest continues the next part). Returns the
    (request, page) start position of each part and the end position, or None when the requests do
    not fit into num_parts parts."""
    starts, b, k, batch = [], 0, 0, len(nb)
    for _ in range(num_parts):
        starts.append((b, k))
        room = budget
        while b < batch:
            need = nb[b] - k + c
            if room >= need:            # the rest of request b fits: take it
                room -= need
                b, k = b + 1, 0
            else:                       # split if at least one page fits beside the overhead
                if room - c >= 1:
                    k += room - c
                break
    return (starts, (b, k)) if b == batch else None


def segment_budget(cache_seqlens, num_parts: int, c: int) -> int:
    """Smallest per-part budget (pages + c per segment) for which _fill places every request: the
    makespan that schedule_ref balances. It lies in [ceil(T / P), ceil(T / P) + 2c] with
    T = sum(pages + c): every part then takes at least budget - c, of which at most c pays for a
    continued request."""
    nb = _pages(cache_seqlens)
    total = sum(n + c for n in nb)
    lo = max(-(-total // num_parts), c)
    for budget in range(lo, lo + 2 * c + 2):
        if _fill(nb, num_parts, c, budget) is not None:
            return budget
    raise AssertionError("unreachable: the budget ceil(T/P) + 2c always fits")


def schedule_ref(cache_seqlens: torch.Tensor, num_parts: int,
                 c: int = SEG_OVERHEAD) -> tuple[torch.Tensor, torch.Tensor]:
    """The tile scheduler of get_mla_metadata, in plain Python (mla_metadata.cu computes the same
    integers on the device).

    Every segment, a request or the piece of one that a part holds, costs its pages plus c
    (SEG_OVERHEAD = 5 by default, FLASHMLA_SPLIT_OVH=c in get_mla_metadata): a segment pays for
    its Q load, its pipeline fill and, when split, its fp32 partial that the combine reads back.
    Parts are filled greedily in request order up to the smallest budget that fits all requests
    (segment_budget), which balances the per-part pages + c * segments and splits a request only
    where it pays; with a large c short requests stay whole (parts left over stay empty:
    begin = end = (batch, 0)).
    Returns tile_scheduler_metadata int32 [num_parts, 8] with rows
    (begin_req, begin_page, end_req, end_page, first_split_index, 0, 0, 0), end exclusive
    (first_split_index = 0 for an empty part), and num_splits int32 [batch + 1], the start index
    of each request's splits (prefix sum; request b has num_splits[b+1] - num_splits[b] segments,
    one per part it touches; a request of one segment skips the combine).
    """
    if not isinstance(c, int) or isinstance(c, bool) or c < 0:
        raise ValueError(f"c (pages per segment): expected an int >= 0, got {c!r}")
    nb = _pages(cache_seqlens)
    batch = len(nb)
    starts, end = _fill(nb, num_parts, c, segment_budget(cache_seqlens, num_parts, c))
    bounds = starts + [end]
    segs = [0] * batch                  # segments per request
    meta = torch.zeros(num_parts, META_SIZE, dtype=torch.int32)
    firsts = []
    for p in range(num_parts):
        (b0, k0), (b1, k1) = bounds[p], bounds[p + 1]
        if (b0, k0) == (b1, k1):
            firsts.append(None)
            continue
        last = b1 if k1 > 0 else b1 - 1
        firsts.append(segs[b0])         # index of b0's segment within b0 (> 0: continued)
        for b in range(b0, last + 1):
            segs[b] += 1
    splits = torch.zeros(batch + 1, dtype=torch.int32)
    for b in range(batch):
        splits[b + 1] = splits[b] + segs[b]
    for p in range(num_parts):
        (b0, k0), (b1, k1) = bounds[p], bounds[p + 1]
        first = 0 if firsts[p] is None else int(splits[b0]) + firsts[p]
        meta[p, :5] = torch.tensor([b0, k0, b1, k1, first], dtype=torch.int32)
    return meta, splits
