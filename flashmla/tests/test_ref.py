"""CPU tests of the reference (the oracle and CPU path) and of the scheduler."""
import math

import pytest
import torch

import flashmla
from flashmla import ref
from flashmla.testing import make_inputs


def dense_oracle(q, k_cache, block_table, seqlens, dv, scale, causal):
    """Independent float64 computation: explicit softmax over the gathered cache per (b, i, h)."""
    b_, s_q, h_q, d = q.shape
    h_kv = k_cache.shape[2]
    out = torch.zeros(b_, s_q, h_q, dv, dtype=torch.float64)
    lse = torch.full((b_, h_q, s_q), math.inf, dtype=torch.float64)
    for b in range(b_):
        L = int(seqlens[b])
        rows = [k_cache[int(block_table[b, t // 64]), t % 64] for t in range(L)]
        if not rows:
            continue
        kv = torch.stack(rows).double()                                  # [L, h_kv, d]
        for i in range(s_q):
            n = L - s_q + 1 + i if causal else L
            for h in range(h_q):
                if n <= 0:
                    continue
                k = kv[:n, h // (h_q // h_kv)]
                s = (k @ q[b, i, h].double()) * scale
                w = torch.softmax(s, 0)
                out[b, i, h] = w @ k[:, :dv]
                lse[b, h, i] = torch.logsumexp(s, 0)
    return out, lse


@pytest.mark.parametrize("s_q,causal,h_kv", [(1, False, 1), (2, True, 1), (3, True, 2), (2, False, 1)])
def test_reference_matches_dense(s_q, causal, h_kv):
    lens = [0, 1, 63, 64, 65, 130, 2]
    q, kc, bt, sl = make_inputs(len(lens), lens, h_q=4, s_q=s_q, h_kv=h_kv, d=40, seed=s_q * 7 + h_kv)
    out, lse = flashmla.mla_decode_ref(q, kc, bt, sl, 32, 0.3, causal)
    o64, l64 = dense_oracle(q, kc, bt, sl, 32, 0.3, causal)
    assert torch.allclose(out.double(), o64, atol=1e-5, rtol=1e-5)
    assert torch.equal(torch.isinf(lse), torch.isinf(l64))
    fin = torch.isfinite(l64)
    assert torch.allclose(lse.double()[fin], l64[fin], rtol=1e-6, atol=1e-6)
    assert not torch.isnan(out).any()
    # empty request: out = 0, lse = +inf
    assert (out[0] == 0).all() and torch.isposinf(lse[0]).all()
    if causal and s_q > 1:   # request of length 1 with s_q > 1: earlier queries see nothing
        assert torch.isposinf(lse[1, :, 0]).all() and (out[1, 0] == 0).all()


def _coverage(meta, splits, lens):
    """Every page of every request covered exactly once; split indices consistent."""
    batch = len(lens)
    seen = {}
    for p in range(meta.shape[0]):
        b0, k0, b1, k1, first = meta[p, :5].tolist()
        if (b0, k0) == (b1, k1):
            continue
        last = b1 if k1 > 0 else b1 - 1
        for j, b in enumerate(range(b0, last + 1)):
            nb = (lens[b] + 63) // 64
            lo = k0 if b == b0 else 0
            hi = k1 if b == b1 else nb
            assert lo < hi or nb == 0
            for k in range(lo, hi):
                assert (b, k) not in seen
                seen[(b, k)] = True
            idx = first + j
            assert splits[b] <= idx < splits[b + 1]
            seen.setdefault(("req", b), []).append(idx)
    for b, L in enumerate(lens):
        for k in range((L + 63) // 64):
            assert (b, k) in seen
        ids = seen[("req", b)]
        assert ids == list(range(int(splits[b]), int(splits[b + 1])))
    assert int(splits[0]) == 0 and int(splits[batch]) <= batch + meta.shape[0]


# ---- the scheduler (ref.schedule_ref: c pages per segment, 5 by default, FLASHMLA_SPLIT_OVH=c)
SEG_CASES = [([4096] * 8, 132), ([0, 0, 5, 100000, 3], 132), ([1] * 300, 132), ([64 * 7] * 3, 16), ([0], 4),
             ([8192, 0, 17], 1), ([4096] * 64, 132), ([1024] * 128, 132), ([16384] + [64] * 131, 132),
             (list(range(0, 20000, 97)), 66), ([0] * 5, 3)]


def _part_loads(meta, lens, c):
    """(pages, segments) of each part."""
    loads = []
    for p in range(meta.shape[0]):
        b0, k0, b1, k1, _ = meta[p, :5].tolist()
        pages = segs = 0
        if (b0, k0) != (b1, k1):
            for b in range(b0, (b1 if k1 > 0 else b1 - 1) + 1):
                nb = (lens[b] + 63) // 64
                pages += (k1 if b == b1 else nb) - (k0 if b == b0 else 0)
                segs += 1
        loads.append((pages, segs))
    return loads


@pytest.mark.parametrize("c", [0, 1, 2, 5, 64])
@pytest.mark.parametrize("lens,parts", SEG_CASES)
def test_segment_schedule_covers_everything_once_within_budget(lens, parts, c):
    """Every page once, split indices consistent; every part within the smallest budget that fits."""
    sl = torch.tensor(lens, dtype=torch.int32)
    meta, splits = ref.schedule_ref(sl, parts, c)
    if c == ref.SEG_OVERHEAD:   # the default of schedule_ref (and of get_mla_metadata)
        dm, ds = ref.schedule_ref(sl, parts)
        assert torch.equal(dm, meta) and torch.equal(ds, splits)
    assert meta.dtype == torch.int32 and splits.dtype == torch.int32 and (meta[:, 5:] == 0).all()
    assert meta.shape == (parts, 8) and splits.shape == (len(lens) + 1,)
    _coverage(meta, splits, lens)
    budget = ref.segment_budget(sl, parts, c)
    total = sum((L + 63) // 64 + c for L in lens)
    assert max(-(-total // parts), c) <= budget <= -(-total // parts) + 2 * c + 1
    loads = _part_loads(meta, lens, c)
    assert all(pg + c * sg <= budget for pg, sg in loads)
    # the budget is the smallest that fits: one less leaves requests over
    nb = [(L + 63) // 64 for L in lens]
    assert budget == max(-(-total // parts), c) or ref._fill(nb, parts, c, budget - 1) is None
    # no split leaves an empty piece, parts past the last request are empty at (batch, 0)
    for p in range(parts):
        b0, k0, b1, k1, first = meta[p, :5].tolist()
        if (b0, k0) == (b1, k1):
            assert first == 0
        if b0 == len(lens):
            assert (b0, k0, b1, k1) == (len(lens), 0, len(lens), 0)


def test_segment_schedule_keeps_short_requests_whole():
    """With the default 5 pages per segment, 128 requests of 64 pages on 132 parts are not split at
    all (c = 0, pure page balance, splits every one: 256 segments); 64 requests of 16 pages are
    halved (8 pages per part); one long request among short ones is spread over the parts but in
    fewer pieces than with c = 0."""
    sl = torch.tensor([4096] * 128, dtype=torch.int32)
    meta, splits = ref.schedule_ref(sl, 132)
    assert torch.equal(splits, torch.arange(129, dtype=torch.int32))
    assert int(ref.schedule_ref(sl, 132, 0)[1][-1]) == 256
    meta, splits = ref.schedule_ref(torch.tensor([1024] * 64, dtype=torch.int32), 132)
    assert max(pg for pg, _ in _part_loads(meta, [1024] * 64, 5)) == 8 and int(splits[-1]) == 128
    lens = [16384] + [64] * 131
    sl = torch.tensor(lens, dtype=torch.int32)
    n5, n0 = (int(ref.schedule_ref(sl, 132, c)[1][1]) for c in (5, 0))
    assert 10 < n5 < n0


def _split_decode(q, kc, bt, sl, meta, splits, causal):
    """CPU emulation of the kernels' split-KV path: each part's segments as normalised partial O and
    lse over their pages (unsplit requests straight to the output), then the combine's merge."""
    batch, s_q, h_q, d = q.shape
    lens = sl.tolist()
    out = torch.zeros(batch, s_q, h_q, 512, dtype=torch.float64)
    lse = torch.full((batch, h_q, s_q), math.inf, dtype=torch.float64)
    part_o, part_l = {}, {}
    scale = d ** -0.5
    for p in range(meta.shape[0]):
        b0, k0, b1, k1, first = meta[p, :5].tolist()
        if (b0, k0) == (b1, k1):
            continue
        for j, b in enumerate(range(b0, (b1 if k1 > 0 else b1 - 1) + 1)):
            L, nb = lens[b], (lens[b] + 63) // 64
            lo, hi = (k0 if b == b0 else 0) * 64, min((k1 if b == b1 else nb) * 64, L)
            keys = torch.arange(lo, hi)
            kv = torch.stack([kc[int(bt[b, t // 64]), t % 64, 0] for t in keys.tolist()]).double() \
                if hi > lo else torch.zeros(0, d, dtype=torch.float64)
            qb = q[b].double().reshape(s_q * h_q, d)
            s = qb @ kv.T * scale                                          # [rows, keys]
            if causal:
                lim = L - s_q + 1 + torch.arange(s_q).repeat_interleave(h_q)
                s = s.masked_fill(keys[None, :] >= lim[:, None], -math.inf)
            mx = s.amax(-1, keepdim=True) if s.shape[1] else torch.full((s_q * h_q, 1), -math.inf, dtype=torch.float64)
            e = torch.exp(s - torch.where(torch.isinf(mx), torch.zeros_like(mx), mx))
            tot = e.sum(-1, keepdim=True)
            o = torch.where(tot > 0, e @ kv[:, :512] / tot.clamp_min(1e-300), torch.zeros(1, dtype=torch.float64))
            l = torch.where(tot[:, 0] > 0, mx[:, 0] + torch.log(tot[:, 0]), torch.tensor(-math.inf, dtype=torch.float64))
            if splits[b + 1] - splits[b] > 1:
                g = first + j
                assert splits[b] <= g < splits[b + 1] and g not in part_o
                part_o[g], part_l[g] = o, l
            else:
                out[b] = o.view(s_q, h_q, 512)
                lse[b] = torch.where(torch.isinf(l), torch.tensor(math.inf, dtype=torch.float64), l).view(s_q, h_q).T
    for b in range(batch):
        ids = range(int(splits[b]), int(splits[b + 1]))
        if len(ids) <= 1:
            continue
        ls = torch.stack([part_l[g] for g in ids])                         # [n, rows]
        mx = ls.amax(0)
        w = torch.exp(ls - torch.where(torch.isinf(mx), torch.zeros_like(mx), mx))
        tot = w.sum(0)
        o = sum(w[j, :, None] * part_o[g] for j, g in enumerate(ids)) / tot.clamp_min(1e-300)[:, None]
        out[b] = torch.where(torch.isinf(mx)[:, None], torch.zeros(1, dtype=torch.float64), o).view(s_q, h_q, 512)
        lse[b] = torch.where(torch.isinf(mx), torch.tensor(math.inf, dtype=torch.float64), mx + torch.log(tot)).view(s_q, h_q).T
    return out, lse


@pytest.mark.parametrize("c", [0, 3, 5, 64])
@pytest.mark.parametrize("lens,parts,s_q,causal", [([300, 0, 1000, 64, 65, 1], 7, 1, False),
                                                   ([700, 129, 2, 0, 1500], 5, 2, True),
                                                   ([2000] * 3, 16, 1, False)])
def test_split_schedules_reproduce_the_reference(lens, parts, s_q, causal, c):
    """The scheduler's metadata (several c), run through the CPU emulation of split + combine, gives
    the reference result: the segments, split indices and num_splits mean what the kernels read."""
    q, kc, bt, sl = make_inputs(len(lens), lens, 3, s_q, seed=len(lens) + parts)
    meta, splits = ref.schedule_ref(sl, parts, c)
    out, lse = _split_decode(q, kc, bt, sl, meta, splits, causal)
    ro, rl = ref.mla_decode_ref(q, kc, bt, sl, 512, causal=causal)
    torch.testing.assert_close(out.float(), ro, atol=2e-5, rtol=1e-4)
    assert torch.equal(torch.isinf(lse), torch.isinf(rl))
    fin = torch.isfinite(rl)
    torch.testing.assert_close(lse[fin].float(), rl[fin], atol=1e-5, rtol=1e-5)


def test_split_overhead_setting_is_read_per_call(monkeypatch):
    """get_mla_metadata reads FLASHMLA_SPLIT_OVH at each call (CPU path here; unset or empty: 5 pages
    per segment); bad values name it."""
    sl = torch.tensor([16384] + [64] * 131, dtype=torch.int32)
    monkeypatch.delenv("FLASHMLA_SPLIT_OVH", raising=False)
    m0, s0 = flashmla.get_mla_metadata(sl, 16, 1)
    rm, rs = ref.schedule_ref(sl, 132, 5)
    assert torch.equal(m0, rm) and torch.equal(s0, rs) and m0.shape == (132, 8) and s0.shape == (133,)
    monkeypatch.setenv("FLASHMLA_SPLIT_OVH", "")
    assert torch.equal(flashmla.get_mla_metadata(sl, 16, 1)[1], s0)
    monkeypatch.setenv("FLASHMLA_SPLIT_OVH", "2")
    m2, s2 = flashmla.get_mla_metadata(sl, 16, 1)
    rm, rs = ref.schedule_ref(sl, 132, 2)
    assert torch.equal(m2, rm) and torch.equal(s2, rs) and not torch.equal(s2, s0)
    for bad in ("-1", "256", "x", "2.5"):
        monkeypatch.setenv("FLASHMLA_SPLIT_OVH", bad)
        with pytest.raises(ValueError, match="FLASHMLA_SPLIT_OVH"):
            flashmla.get_mla_metadata(sl, 16, 1)
    for bad in (-1, None, True):
        with pytest.raises(ValueError, match="pages per segment"):
            ref.schedule_ref(sl, 4, bad)


def test_fp8_roundtrip_accuracy():
    x = torch.randn(3, 64, 1, 576).to(torch.bfloat16)
    y = flashmla.dequantize_kvcache(flashmla.quantize_kvcache(x))
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert torch.equal(y[..., 512:], x[..., 512:])           # RoPE part kept in bf16
    rel = (y[..., :512].float() - x[..., :512].float()).norm() / x[..., :512].float().norm()
    assert rel < 0.04                                          # e4m3: 3 mantissa bits


def test_fp8_dequantise_exact_float32():
    """dtype=torch.float32: every NoPE value is fp8 x its tile's scale rounded to float32 (the bf16 default is that
    value rounded once more); the RoPE part is the stored bf16; other dtypes are refused."""
    x = torch.randn(2, 64, 1, 576).to(torch.bfloat16) * 3
    k8 = flashmla.quantize_kvcache(x)
    y = flashmla.dequantize_kvcache(k8, dtype=torch.float32)
    assert y.dtype == torch.float32 and y.shape == x.shape
    e = k8[..., :512].view(torch.float8_e4m3fn).double().reshape(2, 64, 1, 4, 128)
    s = k8[..., 512:528].contiguous().view(torch.float32).double().reshape(2, 64, 1, 4, 1)
    assert torch.equal(y[..., :512], (e * s).reshape(2, 64, 1, 512).float())  # the float64 product is exact
    assert torch.equal(y[..., 512:], x[..., 512:].float())
    assert torch.equal(flashmla.dequantize_kvcache(k8), y.to(torch.bfloat16))
    with pytest.raises(ValueError, match="dtype"):
        flashmla.dequantize_kvcache(k8, dtype=torch.float16)


def test_fp8_split_parts():
    """flashmla.quant.split_kvcache: the e4m3 values, scales and RoPE columns of each token, and a clear error
    for anything but uint8 [..., 656]."""
    from flashmla.quant import split_kvcache
    x = torch.randn(2, 64, 1, 576).to(torch.bfloat16)
    k8 = flashmla.quantize_kvcache(x)
    e, s, rope = split_kvcache(k8)
    assert e.shape == (2, 64, 1, 512) and s.shape == (2, 64, 1, 4) and rope.dtype == torch.bfloat16
    assert torch.equal(e, k8[..., :512].view(torch.float8_e4m3fn).float())
    assert torch.equal(s, k8[..., 512:528].contiguous().view(torch.float32))
    assert torch.equal(rope, x[..., 512:])
    with pytest.raises(ValueError, match="uint8"):
        split_kvcache(k8.float())


def test_rf_values_and_the_reference_with_a_value_cache():
    """flashmla.testing.rf_values (the register-fed kernel's V, its oracle's values) against a per-page loop:
    sigma the least power of two >= the page's largest live scale, f16(e4m3 * f16(scale / sigma)) * sigma, within
    2^-10 of the float32-dequantised value (and 2^-16 sigma where scale / sigma is an f16 subnormal: tile scales
    over 5.5 decades here), 0 past each length; mla_decode_ref(..., v_cache=) takes V from it."""
    from flashmla.testing import rf_values, wide_tile_cache
    q, kc, bt, sl = make_inputs(3, [100, 0, 64], 4, 1, seed=3)
    k8 = flashmla.quantize_kvcache(wide_tile_cache(kc, 4))
    v = rf_values(k8, bt, sl)
    kd = flashmla.dequantize_kvcache(k8, torch.float32)
    for b, L in enumerate(sl.tolist()):
        for j in range(bt.shape[1]):
            pg, n = int(bt[b, j]), max(0, min(64, L - 64 * j))
            assert (v[pg, n:] == 0).all()
            for t in range(4):
                sc = k8[pg, :n, 0, 512 + 4 * t:516 + 4 * t].contiguous().view(torch.float32).flatten().double()
                mx = sc.max().item() if n else 0.0
                sigma = 2.0 ** math.ceil(math.log2(mx)) if mx > 0 else 1.0
                e = k8[pg, :n, 0, 128 * t:128 * t + 128].view(torch.float8_e4m3fn).double()
                want = (e * (sc / sigma).half().double()[:, None]).half().double() * sigma
                assert torch.equal(v[pg, :n, 0, 128 * t:128 * t + 128].double(), want)
                ref_v = kd[pg, :n, 0, 128 * t:128 * t + 128].double()
                assert ((want - ref_v).abs() <= 2.0 ** -10 * ref_v.abs() + 2.0 ** -16 * sigma).all()
    vc = torch.cat([v, kd[..., 512:]], -1)
    out, lse = ref.mla_decode_ref(q, kd, bt, sl, 512, v_cache=vc)
    o2, l2 = ref.mla_decode_ref(q, vc, bt, sl, 512)  # K from vc as well: only the logits change
    assert torch.equal(out[1], o2[1]) and not torch.equal(lse, l2) and torch.isinf(lse[1]).all()
    assert (out - ref.mla_decode_ref(q, kd, bt, sl, 512)[0]).abs().max() < 1e-3


def test_fp8_query_rounds_each_row_to_e4m3_with_a_power_of_two_scale():
    """flashmla.testing.fp8_query (the oracle's Q under FLASHMLA_FP8_Q=1): per row, NoPE / 2^e has its largest
    magnitude in [224, 448] and is an e4m3 value, within half an e4m3 step of the input; RoPE and zero rows as
    they are; rows over 40 decades."""
    from flashmla.testing import fp8_query
    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 3, 7, 576, generator=g) * torch.logspace(-20, 20, 7)[None, None, :, None]
    q = q.to(torch.bfloat16)
    q[1, 2, 3] = 0
    got = fp8_query(q)
    nope, rope = q.float()[..., :512], q.float()[..., 512:]
    assert got.dtype == torch.float32 and torch.equal(got[..., 512:], rope) and (got[1, 2, 3] == 0).all()
    amax = nope.abs().amax(-1, keepdim=True)
    live = amax[..., 0] > 0
    e = torch.floor(torch.log2(amax / 448)) + 1  # the least e with amax 2^-e <= 448
    e = torch.where(amax / 448 == torch.exp2(e - 1), e - 1, e)
    scaled = got[..., :512] / torch.exp2(e)
    top = scaled.abs().amax(-1)[live]
    assert (top >= 224).all() and (top <= 448).all()  # (above 224 before rounding)
    scaled = scaled[live]
    assert torch.equal(scaled, scaled.to(torch.float8_e4m3fn).float())
    step = torch.exp2(torch.floor(torch.log2(scaled.abs().clamp_min(2.0 ** -6)))) / 8  # e4m3: 3 mantissa bits
    assert ((scaled - (nope / torch.exp2(e))[live]).abs() <= step / 2 + 1e-12).all()
