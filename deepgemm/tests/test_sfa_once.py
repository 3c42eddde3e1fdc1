"""DEEPGEMM_SFA_ONCE (A's scales loaded once per CTA, FP8 dense at M <= 128): the switch's parsing and rule on the
CPU, ptxas' report with nvcc, and on the GPU the kernels against the reference with scales that differ by orders of
magnitude between rows and K blocks, so that any scale read from the wrong row or block shows."""
import re

import pytest
import torch

import deepgemm as dg
from deepgemm import ref
from deepgemm.jit import compiler, kernels
from generators import poisoned

NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def _cfg(n, k, m, once="1", kind="dense", fp8=True, split="auto", blocks="", stages=""):
    return kernels._make_config(kind, fp8, torch.bfloat16, None, n, k, m, 1, 132, "staged", "1", blocks_env=blocks,
                                split_k_env=split, stages_env=stages, sfa_once_env=once)


def test_parsing_and_default(monkeypatch):
    monkeypatch.delenv("DEEPGEMM_SFA_ONCE", raising=False)
    d = torch.empty(1, 1, dtype=torch.bfloat16)
    for n, k in NK:
        assert kernels.make_config("dense", True, d, None, n, k, 64, 1) == _cfg(n, k, 64, kernels.SFA_ONCE_DEFAULT)
    for bad in ("2", "on", "", "yes"):
        with pytest.raises(ValueError, match="DEEPGEMM_SFA_ONCE"):
            _cfg(4096, 7168, 64, bad)


def test_rule():
    """Rows of A's M blocks; only FP8 dense at M <= 128 (not the small-M kernel's M <= 16, not grouped, not BF16);
    kept only where the ring stays at least min(its plain depth, SFA_ONCE_MIN_STAGES) deep, and within the
    shared-memory budget."""
    for m in (17, 37, 64, 100, 128):
        for n, k in NK:
            cfg, plain = _cfg(n, k, m), _cfg(n, k, m, "0")
            assert plain.sfa_rows == 0
            if cfg.sfa_rows:
                assert cfg.sfa_rows == cfg.bm * -(-m // cfg.bm) and cfg.sfa_rows >= m
                assert cfg.stages >= min(plain.stages, kernels.SFA_ONCE_MIN_STAGES)
                assert kernels.smem_bytes(True, k, cfg.bm, cfg.bn, cfg.stages, cfg.epi, cfg.ksplit,
                                          sfa_rows=cfg.sfa_rows, splitk=cfg.splitk) <= kernels.SMEM_LIMIT
                units = -(-m // cfg.bm) * -(-n // cfg.bn) * cfg.splitk
                assert not cfg.splitk or units <= 132
                assert (cfg.bm, cfg.bn, cfg.splitk) == (plain.bm, plain.bn, plain.splitk)
            else:
                assert cfg == plain
    assert _cfg(4096, 7168, 64).sfa_rows == 64 and _cfg(4096, 7168, 128).sfa_rows == 128
    assert _cfg(7168, 16384, 128).sfa_rows == 0  # 64 KB of scales would cost the 7-stage ring two stages
    assert _cfg(4096, 7168, 4096).sfa_rows == 0 and _cfg(4096, 7168, 8).gemv
    assert _cfg(4096, 7168, 64, kind="masked").sfa_rows == 0
    assert _cfg(4096, 7168, 64, fp8=False).sfa_rows == 0
    assert _cfg(4096, 128 * 257, 64, split="0").sfa_rows == 0  # more K blocks than one TMA box holds
    assert kernels.smem_bytes(True, 7168, 64, 32, 12, sfa_rows=64) == \
        kernels.smem_bytes(True, 7168, 64, 32, 12) - 12 * 256 + 64 * 56 * 4 + 16
    assert kernels.smem_bytes(True, 7168, 64, 64, 12, sfa_rows=64, splitk=3) == \
        kernels.smem_bytes(True, 7168, 64, 64, 12) - 12 * 256 + 64 * 19 * 4 + 16  # a slice: at most 19 of 56
    assert _cfg(2112, 7168, 64, split="4").sfa_rows == 64  # 33 N blocks x 4 slices = 132 units
    assert _cfg(2120, 896, 64, split="5").sfa_rows == 0  # 67 x 5 units: some CTA would take two slices


def test_auto():
    """auto (the default): as "1", but only at M > 16, never with split-K or below SFA_ONCE_MIN_KB K blocks."""
    picked = 0
    for m in (1, 17, 37, 64, 100, 128):
        for n, k in NK + [(4096, 28672), (1024, 7168), (7168, 4096), (16384, 7168)]:
            cfg, one, plain = _cfg(n, k, m, "auto"), _cfg(n, k, m, "1"), _cfg(n, k, m, "0")
            if cfg.sfa_rows:
                picked += 1
                assert cfg == one and not cfg.splitk and k // 128 >= kernels.SFA_ONCE_MIN_KB
                assert m > 16
            else:
                assert cfg == plain
                assert not one.sfa_rows or one.splitk or k // 128 < kernels.SFA_ONCE_MIN_KB or m <= 16
    assert picked >= 6 and _cfg(4096, 7168, 64, "auto").sfa_rows == 64 and not _cfg(7168, 4096, 16, "auto").sfa_rows
    assert _cfg(4096, 7168, 128, "auto").sfa_rows == 128 and _cfg(2112, 7168, 64, "auto").sfa_rows == 0  # split-K


def test_source_and_forced_stages():
    cfg = _cfg(4096, 7168, 64)
    assert kernels.kernel_source(cfg).count(f", {cfg.sfa_rows}>(tma_a") == 1
    assert "sfa_rows" not in kernels.kernel_source(_cfg(4096, 7168, 64, "0")).splitlines()[0]
    assert _cfg(4096, 7168, 64, stages="4").stages == 4 and _cfg(4096, 7168, 64, stages="4").sfa_rows == 64


@pytest.mark.skipif(compiler.nvcc_path() is None, reason="nvcc not installed")
def test_kernels_compile_clean(tmp_path, monkeypatch):
    """Every kernel the switch builds on the small-M DeepSeek-V3 shapes at M = 37, 64, 100 and 128 (split-K or not,
    PIPE, BM = 64 and 128): no spills, no stack, no C75xx warning."""
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))
    cfgs = {c for m in (37, 64, 100, 128) for n, k in NK if (c := _cfg(n, k, m)).sfa_rows}
    assert len(cfgs) >= 10 and any(c.splitk for c in cfgs) and any(c.bm == 128 for c in cfgs)
    for cfg in cfgs:
        _, rec = compiler.build("deepgemm_kernel", kernels.kernel_source(cfg), backend="nvcc")
        assert "0 bytes spill stores" in rec.ptxas and "C75" not in rec.ptxas, (cfg, rec.ptxas)
        assert int(re.search(r"Used (\d+) registers", rec.ptxas).group(1)) <= 232


# ---- on the GPU ------------------------------------------------------------------------------------------------
def _spread(rows, k, seed):
    """bf16 [rows, k] whose 1 x 128 groups span 2^-12 .. 2^12 in magnitude: every row and K block of A gets a scale
    of its own order, so a scale taken from another row or block is off by a large factor."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, k, generator=g, device="cuda")
    e = torch.randint(-12, 13, (rows, k // 128), generator=g, device="cuda").float()
    return (x * torch.exp2(e).repeat_interleave(128, dim=1)).to(torch.bfloat16)


def _run(m, n, k, seed, out=torch.bfloat16, c_dtype=None):
    x = _spread(m, k, seed)
    y = torch.randn(n, k, generator=torch.Generator(device="cuda").manual_seed(seed + 1), device="cuda",
                    dtype=torch.bfloat16)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    c = None if c_dtype is None else torch.randn(m, n, device="cuda").to(c_dtype)
    d = poisoned((m, n), out, "cuda")
    dg.fp8_gemm_nt(a, b, d, c=c)
    r = torch.empty(m, n, device="cuda")
    ref.ref_gemm_nt(*a, *b, r, None if c is None else c.float())
    return d, r, kernels.make_config("dense", True, d, c, n, k, m, 1)


def _check(d, r):
    assert not d.float().isnan().any(), "unwritten (NaN) outputs"
    if d.dtype == torch.float8_e4m3fn:
        assert dg.calc_diff(d.float(), r.clamp(-448, 448)) < 2e-3
    else:
        assert dg.calc_diff(d, r) < 1e-5, dg.calc_diff(d, r)


@pytest.mark.gpu
@pytest.mark.parametrize("nk", NK, ids=[f"n{n}k{k}" for n, k in NK])
@pytest.mark.parametrize("m", [1, 5, 17, 37, 64, 100, 128])
def test_sfa_once_dense(m, nk, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_SFA_ONCE", "1")
    d, r, cfg = _run(m, *nk, m + nk[0])
    _check(d, r)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,env,out,c_dtype,once", [
    (37, 1000, 7168, {"DEEPGEMM_SPLIT_K": "3"}, torch.bfloat16, None, True),  # unaligned M and N; slices of 18-19
    (64, 2120, 896, {"DEEPGEMM_SPLIT_K": "5"}, torch.float32, torch.float32, False),  # 335 units: not on 132 SMs
    (64, 2112, 7168, {"DEEPGEMM_SPLIT_K": "4"}, torch.float8_e4m3fn, None, True),  # 132 units, one per CTA
    (100, 2112, 7168, {"DEEPGEMM_SPLIT_K": "3"}, torch.float32, torch.bfloat16, True),  # BM = 128, slices 18-19
    (128, 4096, 7168, {"DEEPGEMM_BLOCKS": "64x64"}, torch.float32, torch.bfloat16, True),  # two M blocks of 64
    (100, 4096, 7168, {"DEEPGEMM_BLOCKS": "128x32", "DEEPGEMM_SPLIT_K": "0"}, torch.bfloat16, None, True),
    (64, 4096, 7168, {"DEEPGEMM_MULTICAST": "1", "DEEPGEMM_SPLIT_K": "4", "DEEPGEMM_BLOCKS": "64x128"},
     torch.bfloat16, None, True),                                               # A multicast, split-K
    (64, 4096, 7168, {"DEEPGEMM_PIPE": "0", "DEEPGEMM_KSPLIT": "0"}, torch.float8_e4m3fn, None, True),
    (64, 2112, 128 * 250, {"DEEPGEMM_BLOCKS": "64x32", "DEEPGEMM_SPLIT_K": "0"}, torch.bfloat16, None, True),
])
def test_sfa_once_edges(m, n, k, env, out, c_dtype, once, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_SFA_ONCE", "1")
    for key, val in env.items():
        monkeypatch.setenv(key, val)
    d, r, cfg = _run(m, n, k, n + m, out, c_dtype)
    assert cfg.sfa_rows == (cfg.bm * -(-m // cfg.bm) if once else 0)
    if "DEEPGEMM_SPLIT_K" in env and env["DEEPGEMM_SPLIT_K"] != "0":
        assert cfg.splitk == int(env["DEEPGEMM_SPLIT_K"])
    _check(d, r)


@pytest.mark.gpu
def test_sfa_once_graph_and_peel(monkeypatch):
    """20 CUDA-graph replays with new A (and so new scales) bit-identical to eager calls; a tail-peeled GEMM
    (M = 4000: the last 32 rows as a split-K GEMM of row views, its scales a view of rows 3968..) under the switch."""
    monkeypatch.setenv("DEEPGEMM_SFA_ONCE", "1")
    m, n, k = 64, 4096, 7168
    x = _spread(m, k, 1)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(_spread(n, k, 2))
    assert kernels.make_config("dense", True, torch.empty(1, 1, dtype=torch.bfloat16), None, n, k, m, 1).sfa_rows
    d = poisoned((m, n), torch.bfloat16, "cuda")
    dg.fp8_gemm_nt(a, b, d)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dg.fp8_gemm_nt(a, b, d)
    for i in range(20):
        fresh = dg.per_token_cast_to_fp8(_spread(m, k, 10 + i))
        a[0].copy_(fresh[0])
        a[1].copy_(fresh[1])
        d.fill_(float("nan"))
        graph.replay()
        eager = poisoned((m, n), torch.bfloat16, "cuda")
        dg.fp8_gemm_nt(a, b, eager)
        assert torch.equal(d, eager)
    r = torch.empty(m, n, device="cuda")
    ref.ref_gemm_nt(*a, *b, r)
    _check(d, r)
    assert kernels.peel_rows(4000, 2112, 7168, 132, 128, 128) == 3968
    assert _cfg(2112, 7168, 32).sfa_rows == 64
    d, r, _ = _run(4000, 2112, 7168, 7)
    _check(d, r)
