"""The small-M FP8 kernel (sm90_gemv.cuh, DEEPGEMM_GEMV): when it is chosen, its K slices, its source and ptxas
report (CPU, nvcc where installed), and its outputs against the reference (GPU)."""
import re

import pytest
import torch

import deepgemm as dg
from deepgemm.jit import compiler, kernels
from generators import poisoned
from test_gemm_gpu import DEV, NK, _rand, _split_run


def _cfg(m, n, k, out=torch.bfloat16, c=None, num_sms=132, **env):
    return kernels._make_config("dense", True, out, c, n, k, m, 1, num_sms, "staged", "1", **env)


def test_gemv_chosen_where_tma_tiles_are_thin():
    """auto: FP8 dense, M <= 16, where the TMA kernels' unsplit tiles would be <= 32 wide (N = 2112: BN 16;
    N = 4096, K = 7168: BN 32); 1: every FP8 dense M <= 16; 0, or a switch forcing a TMA kernel: never."""
    for m in (1, 8, 9, 16):
        for n, k in ((2112, 7168), (4096, 7168)):
            cfg = _cfg(m, n, k)
            assert (cfg.gemv, cfg.bm, cfg.bn, cfg.threads) == (1 if m <= 8 else 2, 8 if m <= 8 else 16, 16, 256)
        for n, k in ((24576, 1536), (32768, 512), (7168, 16384), (7168, 2048)):
            assert _cfg(m, n, k).gemv == 0 and _cfg(m, n, k, gemv_env="1").gemv == (1 if m <= 8 else 2)
    assert _cfg(17, 2112, 7168).gemv == 0 and _cfg(17, 2112, 7168, gemv_env="1").gemv == 0
    assert kernels._make_config("masked", True, torch.bfloat16, None, 2112, 7168, 8, 4, 132, "staged", "1").gemv == 0
    assert kernels._make_config("dense", False, torch.bfloat16, None, 2112, 7168, 8, 1, 132, "staged", "1").gemv == 0
    for env in ({"gemv_env": "0"}, {"swap_env": "1"}, {"blocks_env": "64x64"}, {"split_k_env": "4"},
                {"split_k_env": "0"}):
        assert _cfg(1, 2112, 7168, **env).gemv == 0, env
    with pytest.raises(ValueError, match="DEEPGEMM_GEMV: expected 0, 1 or auto"):
        _cfg(1, 2112, 7168, gemv_env="2")
    with pytest.raises(ValueError, match="DEEPGEMM_GEMV_KS: expected 1, 2, 4 or 8"):
        _cfg(1, 2112, 7168, gemv_ks_env="3")


def test_gemv_slices_and_stages():
    """K slices: the fewest waves (two CTAs per SM) x (K blocks per warp + the fill), the larger count on a tie; the
    ring as deep as half an SM's shared memory allows, no deeper than a warp's K blocks."""
    want = {(2112, 7168): 8, (24576, 1536): 1, (32768, 512): 1, (7168, 16384): 4, (4096, 7168): 8, (7168, 2048): 4}
    for (n, k), ks in want.items():
        assert kernels.gemv_slices(n, k, 132) == ks, (n, k)
        for mt in (1, 2):
            st = kernels.gemv_stages(mt, k, ks)
            assert kernels.gemv_smem(mt, st, k, ks) <= kernels.GEMV_SMEM_LIMIT
            assert st == -(-(k // 128) // ks) or kernels.gemv_smem(mt, st + 1, k, ks) > kernels.GEMV_SMEM_LIMIT
            assert st >= (4 if mt == 1 else 3) or st == -(-(k // 128) // ks)
    assert 2 * (kernels.GEMV_SMEM_LIMIT + 1024) <= 228 * 1024
    assert kernels.gemv_slices(2112, 7168, 33) == 4
    assert kernels.gemv_slices(256, 256, 132) == 2  # at most the K blocks
    assert kernels.gemv_slices(256, 384, 132) == 2  # a power of two
    assert kernels.gemv_slices(2112, 7168, 132, "2") == 2 and kernels.gemv_slices(2112, 256, 132, "8") == 2
    assert kernels.gemv_stages(1, 128, 1) == 1


def test_gemv_source():
    cfg = _cfg(3, 1000, 384, out=torch.float32, c=torch.bfloat16, gemv_env="1")
    src = kernels.kernel_source(cfg)
    assert src.startswith("// deepgemm kernel {") and "'gemv': 1, 'gemv_ks': 2" in src.splitlines()[0]
    assert "dg::gemv_body<1, 2, 1000, 384, 1, 2, 2>(\n      tma_a, tma_b, tma_sfa, sfb, d, c, M);" in src
    assert "__launch_bounds__(256, 2)" in src  # two CTAs to an SM
    assert "'gemv'" not in kernels.kernel_source(_cfg(64, 1000, 384)).splitlines()[0]  # other kernels: as before


@pytest.mark.skipif(compiler.nvcc_path() is None, reason="nvcc not installed")
def test_gemv_kernels_compile_clean(tmp_path, monkeypatch):
    """8 and 16 rows, every K-slice count, FP32 / BF16 C, FP32 / FP8 output: no spills, no stack, registers for two
    CTAs to an SM."""
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))
    cfgs = [_cfg(m, n, k, gemv_env="1", gemv_ks_env=ks) for m in (1, 16) for n, k in ((2112, 7168), (7168, 16384))
            for ks in ("1", "2", "4", "8")]
    cfgs += [_cfg(5, 4096, 7168, torch.float32, torch.float32), _cfg(12, 4096, 7168, torch.bfloat16, torch.bfloat16),
             _cfg(1, 4096, 7168, torch.float8_e4m3fn)]
    assert all(c.gemv for c in cfgs)
    for cfg in cfgs:
        _, rec = compiler.build("deepgemm_kernel", kernels.kernel_source(cfg), backend="nvcc")
        assert not compiler.spills(rec.ptxas) and "0 bytes spill stores" in rec.ptxas, (cfg, rec.ptxas)
        regs = int(re.search(r"Used (\d+) registers", rec.ptxas).group(1))
        assert regs * cfg.threads * kernels.GEMV_CTAS_PER_SM <= 65536, (cfg, regs)


# ---- GPU: one FP8 dense GEMM into a poisoned output beside the reference (test_gemm_gpu's split-K helper) ------
@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 7, 8, 9, 16])
@pytest.mark.parametrize("nk", NK, ids=[f"n{n}k{k}" for n, k in NK])
def test_gemv_dense(m, nk, monkeypatch):
    """DEEPGEMM_GEMV=1 at M <= 16 on the DeepSeek-V3 shapes: poisoned output, the reference's tolerance."""
    monkeypatch.setenv("DEEPGEMM_GEMV", "1")
    n, k = nk
    seed = m * 7 + n
    d, r, cfg, _ = _split_run(m, n, k, seed)
    orig = _rand((m, k), seed).float() @ _rand((n, k), seed + 1).float().t()  # _split_run's inputs, unquantised
    assert cfg.gemv
    assert not d.float().isnan().any(), "unwritten (NaN) outputs"
    assert dg.calc_diff(d, r) < 1e-5 and dg.calc_diff(d, orig) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("ks", ["1", "2", "4", "8"])
@pytest.mark.parametrize("m,n,k,out,c_dtype", [
    (1, 1000, 7168, torch.bfloat16, None),         # N = 62.5 row groups: the last one half past N
    (3, 24, 128, torch.float32, torch.float32),    # one K block (slices capped at 1), two row groups, FP32 C
    (16, 2120, 896, torch.bfloat16, torch.bfloat16),  # 7 K blocks over the slices, BF16 C
    (13, 4096, 7168, torch.float32, None),         # FP32 out, 13 rows: the second 8-row MMA column half empty
    (4, 7168, 2048, torch.float8_e4m3fn, None),    # FP8 out
])
def test_gemv_edges(m, n, k, out, c_dtype, ks, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_GEMV", "1")
    monkeypatch.setenv("DEEPGEMM_GEMV_KS", ks)
    d, r, cfg, _ = _split_run(m, n, k, n + k + m, out, c_dtype)
    assert cfg.gemv and cfg.gemv_ks == min(int(ks), max(s for s in (1, 2, 4, 8) if s <= k // 128))
    assert not d.float().isnan().any()
    if out == torch.float8_e4m3fn:
        assert dg.calc_diff(d.float(), r.clamp(-448, 448)) < 2e-3
    else:
        assert dg.calc_diff(d, r) < 1e-5


@pytest.mark.gpu
def test_gemv_deterministic_and_graphs(monkeypatch):
    """The default (auto) kernel at 5 x 4096 x 7168: repeated calls are bit-identical (the slices are summed in a
    fixed order), 20 CUDA-graph replays into a poisoned output too; the result agrees with the TMA kernel's
    (DEEPGEMM_GEMV=0) to the reference tolerance."""
    m, n, k = 5, 4096, 7168
    d, r, cfg, (a, b, _) = _split_run(m, n, k, 3)
    assert cfg.gemv
    first = d.clone()
    for _ in range(3):
        d.fill_(float("nan"))
        dg.fp8_gemm_nt(a, b, d)
        torch.cuda.synchronize()
        assert torch.equal(d, first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dg.fp8_gemm_nt(a, b, d)
    for _ in range(20):
        d.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(d, first)
    monkeypatch.setenv("DEEPGEMM_GEMV", "0")
    d2 = poisoned((m, n), torch.bfloat16, DEV)
    dg.fp8_gemm_nt(a, b, d2)
    assert dg.calc_diff(d2, d.float()) < 1e-5
