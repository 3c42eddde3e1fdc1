"""DEEPGEMM_PDL (programmatic dependent launch): the switch's config on the CPU; on the GPU, chains of GEMMs where
each reads what the one before wrote (and overwrites what it read), eager and in a CUDA graph, bit-identical to
the same chain launched without PDL."""
import pytest
import torch

import deepgemm as dg
from deepgemm.jit import kernels

B = torch.bfloat16


def _cfg(kind, n, k, m, groups, pdl, **kw):
    return kernels._make_config(kind, True, B, None, n, k, m, groups, 132, "staged", "1", pdl_env=pdl, **kw)


def test_pdl_config_and_source(monkeypatch):
    """On by default; 0: plain launch; 1: PDL, the same kernel (source and cache entry) otherwise; a bad value
    raises naming the switch."""
    monkeypatch.delenv("DEEPGEMM_PDL", raising=False)
    d = torch.empty(1, 1, dtype=B)
    assert kernels.make_config("dense", True, d, None, 7168, 2048, 64, 1).pdl == 1
    cases = [("dense", 7168, 2048, 64, 1, {}), ("dense", 2112, 7168, 128, 1, {}), ("dense", 7168, 16384, 4096, 1, {}),
             ("masked", 4096, 7168, 64, 8, {}), ("contiguous", 4096, 7168, 8192, 1, {}),
             ("dense", 7168, 2048, 8, 1, {"swap_env": "1"})]
    for kind, n, k, m, g, kw in cases:
        plain, pdl = (_cfg(kind, n, k, m, g, v, **kw) for v in "01")
        assert (plain.pdl, pdl.pdl) == (0, 1)
        assert kernels.kernel_source(plain) == kernels.kernel_source(pdl)
    hdr = kernels.compiler.read_header()
    assert hdr.count("grid_dep_wait();") == 1 and "griddepcontrol.wait" in hdr
    for bad in ("2", "on"):
        with pytest.raises(ValueError, match="DEEPGEMM_PDL"):
            _cfg("dense", 4096, 7168, 64, 1, bad)


def _fp8(shape, seed, per_block=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*shape, generator=g, device="cuda", dtype=B)
    return dg.per_block_cast_to_fp8(x) if per_block else dg.per_token_cast_to_fp8(x)


def _dense_chain(m, n, k, steps=6):
    """x <- A B^T + y; y <- A B^T + x; ...: every GEMM reads the previous one's output as C (RAW) and writes
    the buffer the previous one read (WAR). Returns the step function and its two FP32 buffers."""
    a, b = _fp8((m, k), m + n), _fp8((n, k), k, per_block=True)
    x, y = torch.empty(m, n, device="cuda"), torch.empty(m, n, device="cuda")

    def step():
        for i in range(steps):
            src, dst = (x, y) if i % 2 == 0 else (y, x)
            dg.fp8_gemm_nt(a, b, dst, c=src)
    return step, x, y


def _run_chain(monkeypatch, pdl, m, n, k, graph):
    monkeypatch.setenv("DEEPGEMM_PDL", pdl)
    step, x, y = _dense_chain(m, n, k)
    x0 = torch.randn(m, n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7))
    x.copy_(x0); y.fill_(float("nan"))
    step()  # eager (also compiles outside any capture)
    torch.cuda.synchronize()
    out = [x.clone()]
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        for _ in range(3):
            x.copy_(x0); y.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            out.append(x.clone())
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 2112, 7168), (16, 4096, 7168), (64, 7168, 2048), (128, 2112, 7168),
                                   (200, 4096, 512), (4096, 7168, 2048)])
def test_pdl_dense_chain(m, n, k, monkeypatch):
    """The small-M kernel (M <= 16), split-K (M <= 128), the plain and the 128 x 256 kernels: eager and graph
    replays equal the plain launch's."""
    want = _run_chain(monkeypatch, "0", m, n, k, graph=False)[0]
    assert not want.isnan().any()
    for got in _run_chain(monkeypatch, "1", m, n, k, graph=True):
        assert torch.equal(got, want)


@pytest.mark.gpu
def test_pdl_swap_ab_chain(monkeypatch):
    monkeypatch.setenv("DEEPGEMM_SWAP_AB", "1")
    want = _run_chain(monkeypatch, "0", 8, 4096, 7168, graph=False)[0]
    for got in _run_chain(monkeypatch, "1", 8, 4096, 7168, graph=True):
        assert torch.equal(got, want)


@pytest.mark.gpu
def test_pdl_grouped_then_dense(monkeypatch):
    """masked -> dense (C = the masked output) -> contiguous (overwrites the masked output the dense GEMM read),
    in a graph replayed with new masked_m, against the same launched without PDL."""
    g, m_max, n, k = 4, 128, 4096, 7168  # (contiguous: 128-row expert blocks)
    a3 = _fp8((g, m_max, k), 1)
    a3 = (a3[0], dg.get_mn_major_tma_aligned_tensor(a3[1]))
    bg = _fp8((g, n, k), 2, per_block=True)
    a2, b2 = _fp8((g * m_max, k), 3), _fp8((n, k), 4, per_block=True)
    m_idx = torch.arange(g, device="cuda", dtype=torch.int32).repeat_interleave(m_max)
    masked_m = torch.tensor([128, 0, 17, 100], dtype=torch.int32, device="cuda")
    d_masked = torch.zeros(g, m_max, n, dtype=B, device="cuda")
    d_dense = torch.empty(g * m_max, n, dtype=B, device="cuda")

    def step():
        dg.m_grouped_fp8_gemm_nt_masked(a3, bg, d_masked, masked_m, 64)
        dg.fp8_gemm_nt(a2, b2, d_dense, c=d_masked.view(g * m_max, n))
        dg.m_grouped_fp8_gemm_nt_contiguous(a2, bg, d_masked.view(g * m_max, n), m_idx)

    def run(pdl, graph):
        monkeypatch.setenv("DEEPGEMM_PDL", pdl)
        masked_m.copy_(torch.tensor([128, 0, 17, 100]))
        d_masked.zero_(); d_dense.fill_(float("nan"))
        step()
        torch.cuda.synchronize()
        if not graph:
            return d_dense.clone(), d_masked.clone()
        cg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cg):
            step()
        d_masked.zero_(); d_dense.fill_(float("nan"))
        cg.replay()
        torch.cuda.synchronize()
        return d_dense.clone(), d_masked.clone()

    want = run("0", graph=False)
    assert not want[0].isnan().any()
    for got in (run("1", graph=False), run("1", graph=True)):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
