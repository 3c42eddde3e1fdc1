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


@pytest.mark.parametrize("lens,parts", [([4096] * 8, 132), ([0, 0, 5, 100000, 3], 132),
                                        ([1] * 300, 132), ([64 * 7] * 3, 16), ([0], 4), ([8192, 0, 17], 1)])
def test_schedule_covers_everything_once(lens, parts):
    meta, splits = ref.schedule_ref(torch.tensor(lens, dtype=torch.int32), parts)
    assert meta.shape == (parts, 8) and splits.shape == (len(lens) + 1,)
    _coverage(meta, splits, lens)


def test_schedule_balances():
    lens = [16384] + [64] * 200
    meta, _ = ref.schedule_ref(torch.tensor(lens, dtype=torch.int32), 132)
    costs = []
    for p in range(132):
        b0, k0, b1, k1, _ = meta[p, :5].tolist()
        c = 0
        for b in range(b0, (b1 if k1 > 0 else b1 - 1) + 1):
            nb = (lens[b] + 63) // 64
            c += (k1 if b == b1 else nb) - (k0 if b == b0 else 0) + ref.FIXED_OVERHEAD
        costs.append(c)
    total = sum((L + 63) // 64 + ref.FIXED_OVERHEAD for L in lens)
    assert max(costs) <= total / 132 + 2 * ref.FIXED_OVERHEAD + 1


def test_fp8_roundtrip_accuracy():
    x = torch.randn(3, 64, 1, 576).to(torch.bfloat16)
    y = flashmla.dequantize_kvcache(flashmla.quantize_kvcache(x))
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert torch.equal(y[..., 512:], x[..., 512:])           # RoPE part kept in bf16
    rel = (y[..., :512].float() - x[..., :512].float()).norm() / x[..., :512].float().norm()
    assert rel < 0.04                                          # e4m3: 3 mantissa bits
