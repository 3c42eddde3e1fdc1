"""The GEMM ops on CPU (the reference path) against an independent float64 oracle."""
import pytest
import torch

import deepgemm as dg
from generators import blockwise_oracle, poisoned, rand

DEV = "cpu"


@pytest.mark.parametrize("m,n,k", [(1, 128, 128), (37, 256, 512), (128, 2112, 256), (200, 64, 384)])
def test_fp8_gemm_nt(m, n, k):
    x, y = rand((m, k), m + n, DEV), rand((n, k), m + n + 1, DEV)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    d = poisoned((m, n), torch.bfloat16, DEV)
    dg.fp8_gemm_nt(a, b, d)
    assert not d.isnan().any()
    assert dg.calc_diff(d, blockwise_oracle(*a, *b)) < 1e-5
    assert dg.calc_diff(d, x.float() @ y.float().t()) < 1e-3  # quantisation error, DeepGEMM's bound


def test_fp8_gemm_accumulate_and_outputs():
    m, n, k = 64, 256, 256
    x, y = rand((m, k), 1, DEV), rand((n, k), 2, DEV)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    c = rand((m, n), 3, DEV, torch.float32, scale=10.0)
    d = poisoned((m, n), torch.float32, DEV)
    dg.fp8_gemm_nt(a, b, d, c=c)
    assert dg.calc_diff(d, blockwise_oracle(*a, *b) + c.double()) < 1e-6
    d8 = poisoned((m, n), torch.float8_e4m3fn, DEV)
    dg.fp8_gemm_nt(a, b, d8)
    assert dg.calc_diff(d8.float(), blockwise_oracle(*a, *b)) < 2e-3
    # first-release alias gives the same bits
    d1, d2 = poisoned((m, n), torch.bfloat16, DEV), poisoned((m, n), torch.bfloat16, DEV)
    dg.fp8_gemm_nt(a, b, d1)
    dg.gemm_fp8_fp8_bf16_nt(a, b, d2)
    assert torch.equal(d1, d2)


def test_bf16_gemm_nt():
    m, n, k = 50, 128, 192
    x, y = rand((m, k), 5, DEV), rand((n, k), 6, DEV)
    d = poisoned((m, n), torch.bfloat16, DEV)
    dg.bf16_gemm_nt(x, y, d)
    assert dg.calc_diff(d, x.double() @ y.double().t()) < 1e-5


@pytest.mark.parametrize("fp8", [True, False])
def test_m_grouped_contiguous(fp8):
    n, k = 256, 256
    group_ms = [100, 0, 128, 7]
    m_indices = dg.testing.make_contiguous_m_indices(group_ms, device=DEV)
    m, g = m_indices.numel(), len(group_ms)
    x, y = rand((m, k), 7, DEV), rand((g, n, k), 8, DEV)
    d = poisoned((m, n), torch.bfloat16, DEV)
    if fp8:
        a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
        dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)
    else:
        dg.m_grouped_bf16_gemm_nt_contiguous(x, y, d, m_indices)
    valid = m_indices >= 0
    assert d[~valid].isnan().all()  # padding rows untouched
    for gi in range(g):
        rows = (m_indices == gi).nonzero().flatten()
        if rows.numel() == 0:
            continue
        ref = (blockwise_oracle(a[0][rows], a[1][rows], b[0][gi], b[1][gi]) if fp8
               else x[rows].double() @ y[gi].double().t())
        assert dg.calc_diff(d[rows], ref) < 1e-5


@pytest.mark.parametrize("fp8", [True, False])
def test_m_grouped_masked(fp8):
    g, m_max, n, k = 4, 96, 128, 256
    masked_m = torch.tensor([0, 96, 33, 1], dtype=torch.int32)
    x, y = rand((g, m_max, k), 9, DEV), rand((g, n, k), 10, DEV)
    d = poisoned((g, m_max, n), torch.bfloat16, DEV)
    if fp8:
        a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
        dg.m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m=32)
    else:
        dg.m_grouped_bf16_gemm_nt_masked(x, y, d, masked_m, 32)
    for gi, mm in enumerate(masked_m.tolist()):
        assert d[gi, mm:].isnan().all()
        if mm:
            ref = (blockwise_oracle(a[0][gi, :mm], a[1][gi, :mm], b[0][gi], b[1][gi]) if fp8
                   else x[gi, :mm].double() @ y[gi].double().t())
            assert dg.calc_diff(d[gi, :mm], ref) < 1e-5


def test_aliases_grouped():
    g, m_max, n, k = 2, 16, 64, 128
    x, y = rand((g, m_max, k), 11, DEV), rand((g, n, k), 12, DEV)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    mm = torch.tensor([16, 5], dtype=torch.int32)
    d1, d2 = poisoned((g, m_max, n), torch.bfloat16, DEV), poisoned((g, m_max, n), torch.bfloat16, DEV)
    dg.m_grouped_fp8_gemm_nt_masked(a, b, d1, mm, 16)
    dg.m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, b, d2, mm, 16)
    assert torch.equal(d1.nan_to_num(), d2.nan_to_num())


def test_zero_m():
    a = dg.per_token_cast_to_fp8(torch.randn(0, 128))
    b = dg.per_block_cast_to_fp8(torch.randn(64, 128))
    d = torch.empty(0, 64, dtype=torch.bfloat16)
    dg.fp8_gemm_nt(a, b, d)  # nothing to do, no error
