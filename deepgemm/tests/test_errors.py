"""Bad input: a clear TypeError/ValueError naming the argument, and d left untouched."""
import pytest
import torch

import deepgemm as dg
from generators import poisoned, rand


def _inputs(m=64, n=128, k=256, dev="cpu"):
    a = dg.per_token_cast_to_fp8(rand((m, k), 1, dev))
    b = dg.per_block_cast_to_fp8(rand((n, k), 2, dev))
    return a, b, poisoned((m, n), torch.bfloat16, dev)


def _expect(exc, match, fn, d):
    with pytest.raises(exc, match=match):
        fn()
    assert d.isnan().all(), "d was written before the error"


def test_dense_errors():
    (a, sa), (b, sb), d = _inputs()
    _expect(TypeError, "^a: expected dtype", lambda: dg.fp8_gemm_nt((a.float(), sa), (b, sb), d), d)
    _expect(TypeError, "^b: expected a pair", lambda: dg.fp8_gemm_nt((a, sa), b, d), d)
    _expect(TypeError, "a scaling factors.*float32", lambda: dg.fp8_gemm_nt((a, sa.half()), (b, sb), d), d)
    _expect(ValueError, r"a scaling factors.*shape \(64, 2\)", lambda: dg.fp8_gemm_nt((a, sa.t()), (b, sb), d), d)
    # per-token scales given for B instead of per-block ones
    _expect(ValueError, "b scaling factors", lambda: dg.fp8_gemm_nt((a, sa), (b, torch.ones(128, 2)), d), d)
    _expect(ValueError, "^d: expected shape", lambda: dg.fp8_gemm_nt((a, sa), (b, sb), d[:, :64]), d)
    _expect(TypeError, "^d: expected dtype", lambda: dg.fp8_gemm_nt((a, sa), (b, sb), d.half()), d)
    _expect(ValueError, "^c: expected shape", lambda: dg.fp8_gemm_nt((a, sa), (b, sb), d, c=torch.zeros(1, 1)), d)
    _expect(ValueError, "^recipe", lambda: dg.fp8_gemm_nt((a, sa), (b, sb), d, recipe=(1, 1, 128)), d)
    # K not a multiple of 128
    a2, sa2 = dg.per_token_cast_to_fp8(torch.randn(64, 200))
    b2, sb2 = dg.per_block_cast_to_fp8(torch.randn(128, 200))
    _expect(ValueError, "multiple of 128, got K = 200", lambda: dg.fp8_gemm_nt((a2, sa2), (b2, sb2), d), d)
    # K mismatch, non-contiguous / misaligned operands
    _expect(ValueError, "^b: expected K = 256", lambda: dg.fp8_gemm_nt((a, sa), (b[:, :128], sb[:, :1]), d), d)
    wide = torch.empty(64, 512, dtype=torch.float8_e4m3fn)
    _expect(ValueError, "^a: expected a contiguous", lambda: dg.fp8_gemm_nt((wide[:, :256], sa), (b, sb), d), d)
    flat = torch.empty(64 * 256 + 1, dtype=torch.float8_e4m3fn)
    mis = flat[1:].view(64, 256)
    _expect(ValueError, "^a: expected a 16-byte aligned", lambda: dg.fp8_gemm_nt((mis, sa), (b, sb), d), d)
    # bf16 path
    _expect(TypeError, "^a: expected dtype torch.bfloat16",
            lambda: dg.bf16_gemm_nt(torch.zeros(64, 256), torch.zeros(128, 256, dtype=torch.bfloat16), d), d)


def test_contiguous_errors():
    m, n, k, g = 256, 128, 128, 2
    a = dg.per_token_cast_to_fp8(rand((m, k), 3, "cpu"))
    b = dg.per_block_cast_to_fp8(rand((g, n, k), 4, "cpu"))
    d = poisoned((m, n), torch.bfloat16, "cpu")
    good = dg.testing.make_contiguous_m_indices([128, 128])
    bad = torch.cat([torch.zeros(100, dtype=torch.int32), torch.ones(156, dtype=torch.int32)])
    _expect(ValueError, "m_indices: expected each group's block of rows to start on a multiple of 128.*row 100",
            lambda: dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, bad), d)
    _expect(ValueError, r"m_indices: expected values in \[-1, 2\)",
            lambda: dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, good + 5), d)
    _expect(TypeError, "m_indices: expected dtype torch.int32",
            lambda: dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, good.long()), d)
    _expect(ValueError, "m_indices: expected shape",
            lambda: dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, good[:128]), d)
    _expect(ValueError, "^b: expected 3 dims",
            lambda: dg.m_grouped_fp8_gemm_nt_contiguous(a, (b[0][0], b[1][0]), d, good), d)


def test_masked_errors():
    g, m_max, n, k = 3, 32, 64, 128
    a = dg.per_token_cast_to_fp8(rand((g, m_max, k), 5, "cpu"))
    b = dg.per_block_cast_to_fp8(rand((g, n, k), 6, "cpu"))
    d = poisoned((g, m_max, n), torch.bfloat16, "cpu")
    mm = torch.tensor([1, 2, 33], dtype=torch.int32)
    _expect(ValueError, r"masked_m: expected values in \[0, 32\].*\[1, 33\]",
            lambda: dg.m_grouped_fp8_gemm_nt_masked(a, b, d, mm, 16), d)
    _expect(ValueError, "masked_m: expected shape",
            lambda: dg.m_grouped_fp8_gemm_nt_masked(a, b, d, mm[:2], 16), d)
    _expect(TypeError, "expected_m",
            lambda: dg.m_grouped_fp8_gemm_nt_masked(a, b, d, torch.ones(3, dtype=torch.int32), "16"), d)
    _expect(ValueError, "^b: expected leading dims",
            lambda: dg.m_grouped_fp8_gemm_nt_masked(a, (b[0][:2], b[1][:2]), d, mm, 16), d)


def test_value_checks_once_per_unchanged_tensor(monkeypatch):
    """m_indices' and masked_m's values (a host sync on the GPU) are read once for a tensor unchanged since it
    passed (the GEMMs of one MoE layer), again after an in-place write or for a new tensor or other bounds, at every
    call for inference tensors; a write that breaks them is caught."""
    reads = []
    read = dg.validate._read
    monkeypatch.setattr(dg.validate, "_read", lambda *s: reads.append(len(s)) or read(*s))
    m, n, k, g = 256, 128, 128, 2
    a = dg.per_token_cast_to_fp8(rand((m, k), 3, "cpu"))
    b = dg.per_block_cast_to_fp8(rand((g, n, k), 4, "cpu"))
    d = torch.empty(m, n, dtype=torch.bfloat16)
    idx = dg.testing.make_contiguous_m_indices([128, 128])
    for _ in range(3):
        dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, idx)
    assert len(reads) == 1
    dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, idx.clone())
    assert len(reads) == 2
    idx[100] = 1                                          # in place: a block now starts at row 100
    with pytest.raises(ValueError, match="row 100"):
        dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, idx)
    with pytest.raises(ValueError, match="row 100"):
        dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, idx)
    assert len(reads) == 4

    ga, m_max = 3, 32
    a3 = dg.per_token_cast_to_fp8(rand((ga, m_max, k), 5, "cpu"))
    b3 = dg.per_block_cast_to_fp8(rand((ga, n, k), 6, "cpu"))
    d3 = torch.empty(ga, m_max, n, dtype=torch.bfloat16)
    mm = torch.tensor([1, 2, 32], dtype=torch.int32)
    for _ in range(3):
        dg.m_grouped_fp8_gemm_nt_masked(a3, b3, d3, mm, 16)
    assert len(reads) == 5
    mm[2] = 33
    with pytest.raises(ValueError, match="masked_m"):
        dg.m_grouped_fp8_gemm_nt_masked(a3, b3, d3, mm, 16)
    assert len(reads) == 6
    with torch.inference_mode():                          # no version counter: read at every call
        mm_inf = torch.tensor([1, 2, 3], dtype=torch.int32)
        for _ in range(2):
            dg.m_grouped_fp8_gemm_nt_masked(a3, b3, d3, mm_inf, 16)
        assert len(reads) == 8
