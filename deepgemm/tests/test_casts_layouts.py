"""FP8 casts, scale layouts and config helpers (CPU)."""
import pytest
import torch

import deepgemm as dg
from deepgemm.utils import FP8_MAX


@pytest.mark.parametrize("m,k", [(1, 128), (37, 256), (128, 7168), (5, 200)])
def test_per_token_cast_roundtrip(m, k):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m * k)) * 3
    q, sf = dg.per_token_cast_to_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (m, k)
    assert sf.dtype == torch.float32 and sf.shape == (m, dg.ceil_div(k, 128))
    deq = q.float() * sf.repeat_interleave(128, dim=1)[:, :k]
    assert dg.calc_diff(deq, x) < 1e-3
    # each group's largest magnitude maps to the top of the FP8 range
    g0 = q[:, :min(k, 128)].float().abs().amax(dim=1)
    assert torch.allclose(g0, torch.full_like(g0, FP8_MAX))


@pytest.mark.parametrize("n,k", [(128, 128), (300, 384), (2112, 256)])
def test_per_block_cast_roundtrip(n, k):
    x = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k))
    q, sf = dg.per_block_cast_to_fp8(x)
    assert sf.shape == (dg.ceil_div(n, 128), dg.ceil_div(k, 128))
    deq = q.float() * sf.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    assert dg.calc_diff(deq, x) < 1e-3
    # one scale per 128x128 block: the block's amax / 448
    assert torch.allclose(sf[0, 0], x[:128, :128].abs().amax() / FP8_MAX)


def test_casts_batched_and_errors():
    x = torch.randn(3, 256, 256)
    q, sf = dg.per_block_cast_to_fp8(x)
    assert q.shape == (3, 256, 256) and sf.shape == (3, 2, 2)
    q1, sf1 = dg.per_block_cast_to_fp8(x[1])
    assert torch.equal(q[1].float(), q1.float()) and torch.equal(sf[1], sf1)
    with pytest.raises(TypeError, match="x"):
        dg.per_token_cast_to_fp8(torch.ones(4, 128, dtype=torch.int32))
    with pytest.raises(ValueError, match="x"):
        dg.per_block_cast_to_fp8(torch.ones(128))


@pytest.mark.parametrize("shape", [(5, 3), (128, 56), (4, 7, 2), (1, 1)])
def test_mn_major_tma_aligned(shape):
    sf = torch.randn(*shape)
    out = dg.get_mn_major_tma_aligned_tensor(sf)
    assert torch.equal(out, sf)
    mn = shape[-2]
    al = dg.get_tma_aligned_size(mn, 4)
    assert al % 4 == 0 and al >= mn
    assert out.stride(-2) == 1
    if shape[-1] > 1:
        assert out.stride(-1) == al
    if len(shape) == 3:
        assert out.stride(0) == al * shape[-1]
    assert dg.get_mn_major_tma_aligned_tensor(out) is out  # already in layout: returned as is
    assert dg.get_col_major_tma_aligned_tensor is dg.get_mn_major_tma_aligned_tensor


def test_config_helpers():
    assert dg.ceil_div(129, 128) == 2 and dg.ceil_div(128, 128) == 1 and dg.ceil_div(0, 128) == 0
    assert dg.get_m_alignment_for_contiguous_layout() == 128
    old = dg.get_num_sms()
    try:
        dg.set_num_sms(7)
        assert dg.get_num_sms() == 7
        with pytest.raises(ValueError, match="num_sms"):
            dg.set_num_sms(0)
    finally:
        dg.set_num_sms(old)
    assert dg.__version__
