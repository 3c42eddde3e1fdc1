"""DEEPGEMM_L2_HINT=1 (B's TMA boxes with an L2 evict_first hint, every kernel): the switch's parsing, the source it
makes (the default kernels' unchanged), ptxas' report and the hinted instruction with nvcc, and on the GPU the kernels
of each family against the reference (a cache hint must not change a single output)."""
import os
import re
import subprocess

import pytest
import torch

import deepgemm as dg
from deepgemm import ref
from deepgemm.jit import compiler, kernels
from generators import poisoned

NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def _cfg(n, k, m, hint="1", kind="dense", groups=1):
    return kernels._make_config(kind, True, torch.bfloat16, None, n, k, m, groups, 132, "staged", "1",
                                l2_hint_env=hint)


def test_parsing_and_default(monkeypatch):
    monkeypatch.delenv("DEEPGEMM_L2_HINT", raising=False)
    d = torch.empty(1, 1, dtype=torch.bfloat16)
    assert kernels.L2_HINT_DEFAULT == "auto"
    assert kernels.make_config("dense", True, d, None, 4096, 7168, 4096, 1).l2b == 0
    monkeypatch.setenv("DEEPGEMM_L2_HINT", "1")
    assert kernels.make_config("dense", True, d, None, 4096, 7168, 4096, 1).l2b == 1
    monkeypatch.setenv("DEEPGEMM_L2_HINT", "0")
    assert kernels.make_config("dense", True, d, None, 4096, 7168, 64, 1).l2b == 0
    for bad in ("2", "on", "", "AUTO"):
        with pytest.raises(ValueError, match="DEEPGEMM_L2_HINT"):
            _cfg(4096, 7168, 64, bad)


def test_auto_hints_where_b_is_read_in_one_wave():
    """auto: on at M <= 128 (small-M kernel, swap-AB, split-K, 64- and 128-row tiles, masked with expected_m <= 128),
    off above it and for the contiguous layout (each group's B read by its M blocks over several waves)."""
    for m in (1, 8, 16, 37, 64, 100, 128):
        for n, k in NK:
            assert _cfg(n, k, m, "auto").l2b == 1, (m, n, k)
    assert _cfg(4096, 7168, 64, "auto", "masked", 8).l2b == 1
    assert _cfg(4096, 7168, 256, "auto", "masked", 8).l2b == 0
    for m in (129, 256, 1000, 4096):
        assert _cfg(7168, 16384, m, "auto").l2b == 0
    assert _cfg(4096, 7168, 8192, "auto", "contiguous", 8).l2b == 0
    assert _cfg(4096, 7168, 128, "auto", "contiguous", 1).l2b == 0


def test_source_only_differs_by_the_define():
    """Each family (small-M kernel, split-K, 128-row tiles, 128 x 256 tiles, masked): the same configuration but for
    l2b, and a source that is the default one with the define in front (and the flag on the first line)."""
    cases = [(4096, 7168, 1, "dense"), (2112, 7168, 64, "dense"), (7168, 2048, 128, "dense"),
             (7168, 16384, 4096, "dense"), (4096, 7168, 64, "masked")]
    for n, k, m, kind in cases:
        on, off = _cfg(n, k, m, "1", kind), _cfg(n, k, m, "0", kind)
        assert on.l2b == 1 and off.l2b == 0 and kernels.replace(on, l2b=0) == off
        src_on, src_off = kernels.kernel_source(on), kernels.kernel_source(off)
        assert "DG_L2_EVICT_FIRST_B" not in src_off.splitlines()[1] and "l2b" not in src_off.splitlines()[0]
        first, rest = src_on.split("\n", 1)
        assert "'l2b': 1" in first and rest.startswith("#define DG_L2_EVICT_FIRST_B 1\n")
        assert rest.split("\n", 1)[1] == src_off.split("\n", 1)[1]


@pytest.mark.skipif(compiler.nvcc_path() is None, reason="nvcc not installed")
def test_kernels_compile_with_the_hint(tmp_path, monkeypatch):
    """The hinted kernels of the small-M DeepSeek-V3 shapes (every family the switch reaches) compile without spills,
    with no more registers than without the hint; where cuobjdump is at hand, their SASS has TMA loads that carry a
    cache-policy operand (`UTMALDG.2D ..., desc[URn]`) and the default kernels' none."""
    from test_multicast import _sass_tools
    tools = _sass_tools()
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))
    cfgs = {_cfg(n, k, m) for m in (1, 64, 128) for n, k in NK[:2]} | {_cfg(7168, 16384, 4096)}
    assert any(c.gemv for c in cfgs) and any(c.splitk for c in cfgs) and any(c.bn == 256 for c in cfgs)
    for cfg in cfgs:
        recs, hinted = [], []
        for c in (cfg, kernels.replace(cfg, l2b=0)):
            cubin, rec = compiler.build("deepgemm_kernel", kernels.kernel_source(c), backend="nvcc")
            recs.append(rec)
            if tools:
                path = tmp_path / "k.cubin"
                path.write_bytes(cubin)
                sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", str(path)], capture_output=True,
                                      text=True, check=True).stdout
                hinted.append(sum("UTMALDG" in ln and "desc[" in ln for ln in sass.splitlines()))
        assert "0 bytes spill stores" in recs[0].ptxas and "C75" not in recs[0].ptxas, (cfg, recs[0].ptxas)
        regs = [int(re.search(r"Used (\d+) registers", r.ptxas).group(1)) for r in recs]
        assert regs[0] <= max(regs[1], 168), (cfg, regs)
        if tools:
            assert hinted[0] >= 1 and hinted[1] == 0, (cfg, hinted)


# ---- on the GPU ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 4096, 7168), (16, 2112, 7168), (64, 2112, 7168), (128, 7168, 16384),
                                   (100, 24576, 1536), (1000, 7168, 2048)])
def test_dense_with_the_hint(m, n, k, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_L2_HINT", "1")
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, k, generator=g, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, k, generator=g, device="cuda", dtype=torch.bfloat16)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    d = poisoned((m, n), torch.bfloat16, "cuda")
    dg.fp8_gemm_nt(a, b, d)
    r = torch.empty(m, n, device="cuda")
    ref.ref_gemm_nt(*a, *b, r, None)
    assert kernels.make_config("dense", True, d, None, n, k, m, 1).l2b == 1
    assert not d.float().isnan().any() and dg.calc_diff(d, r) < 1e-5


@pytest.mark.gpu
def test_masked_with_the_hint(monkeypatch):
    monkeypatch.setenv("DEEPGEMM_L2_HINT", "1")
    groups, m_max, n, k = 4, 128, 4096, 7168
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(groups, m_max, k, generator=g, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(groups, n, k, generator=g, device="cuda", dtype=torch.bfloat16)
    a = [dg.per_token_cast_to_fp8(x[i]) for i in range(groups)]
    b = [dg.per_block_cast_to_fp8(y[i]) for i in range(groups)]
    a8, sfa = torch.stack([t[0] for t in a]), torch.stack([t[1] for t in a])
    b8, sfb = torch.stack([t[0] for t in b]), torch.stack([t[1] for t in b])
    masked_m = torch.tensor([0, 1, 77, 128], device="cuda", dtype=torch.int32)
    d = poisoned((groups, m_max, n), torch.bfloat16, "cuda")
    dg.m_grouped_fp8_gemm_nt_masked((a8, sfa), (b8, sfb), d, masked_m, 64)
    for i, rows in enumerate(masked_m.tolist()):
        if rows:
            r = torch.empty(rows, n, device="cuda")
            ref.ref_gemm_nt(a8[i, :rows], sfa[i, :rows], b8[i], sfb[i], r, None)
            assert dg.calc_diff(d[i, :rows], r) < 1e-5
