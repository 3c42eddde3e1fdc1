"""The SM90 kernels against the reference (fp32 matmul of the dequantised inputs), on the GPU.
Shapes: DeepSeek-V3's dense (N, K) pairs, MoE grouped layouts, unaligned M, masked_m with 0."""
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import deepgemm as dg
from deepgemm import ref
from generators import poisoned

pytestmark = pytest.mark.gpu
DEV = "cuda"
NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
TOL_REF = 1e-5   # vs the dequantised fp32 reference (bf16 output rounding only)
TOL_ORIG = 1e-3  # vs the unquantised product: DeepGEMM's own criterion


def _sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _rand(shape, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, generator=g, device=DEV, dtype=torch.bfloat16)


def _check(d, ref_out, orig=None):
    assert not d.float().isnan().any(), "unwritten (NaN) outputs"
    assert dg.calc_diff(d, ref_out) < TOL_REF, dg.calc_diff(d, ref_out)
    if orig is not None:
        assert dg.calc_diff(d, orig) < TOL_ORIG


def _check_contiguous(d, r, m_indices):
    """Grouped-contiguous output d against the reference r: rows with m_indices == -1 (padding) are
    still NaN (untouched), the others meet _check."""
    valid = m_indices >= 0
    assert d[~valid].float().isnan().all(), "padding rows were written"
    _check(d[valid], r[valid])


def _assert_replays_match(step, d, times):
    """step() (already run eagerly: d holds its result) captured in a CUDA graph and replayed `times`
    times over a NaN-poisoned d: every replay must reproduce the eager result bit for bit."""
    eager = d.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(times):
        d.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(d, eager)


def _check_fp8_with_c(m, n, k, x_seed, y_seed):
    """One FP8 dense GEMM with an FP32 C into poisoned BF16, against the reference."""
    x, y = _rand((m, k), x_seed), _rand((n, k), y_seed)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    c = torch.randn(m, n, device=DEV)
    d = poisoned((m, n), torch.bfloat16, DEV)
    dg.fp8_gemm_nt(a, b, d, c=c)
    r = torch.empty(m, n, device=DEV)
    ref.ref_gemm_nt(*a, *b, r, c)
    _check(d, r)


def _check_bf16_out(x, y, d=None):
    """FP8 dense GEMM of x, y (cast per token / per block) into d (default: poisoned BF16) against the
    reference and the unquantised product; returns the FP8 operands and the reference."""
    m, n = x.shape[0], y.shape[0]
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    d = poisoned((m, n), torch.bfloat16, DEV) if d is None else d
    dg.fp8_gemm_nt(a, b, d)
    r = torch.empty(m, n, device=DEV)
    ref.ref_gemm_nt(*a, *b, r)
    _check(d, r, x.float() @ y.float().t())
    return a, b, r


def _check_dense_outputs(x, y):
    """FP8 dense GEMM of x, y into poisoned BF16, FP32 (+ C) and FP8 outputs, against the reference
    (FP8 output saturates at the e4m3 range)."""
    m, n = x.shape[0], y.shape[0]
    a, b, r = _check_bf16_out(x, y)
    c = torch.randn(m, n, device=DEV)
    d32 = poisoned((m, n), torch.float32, DEV)
    dg.fp8_gemm_nt(a, b, d32, c=c)
    _check(d32, r + c)
    d8 = poisoned((m, n), torch.float8_e4m3fn, DEV)
    dg.fp8_gemm_nt(a, b, d8)
    assert dg.calc_diff(d8.float(), r.clamp(-448, 448)) < 2e-3


def _check_masked_8x64(seed):
    """FP8 masked GEMM, 8 groups x 64 rows (two empty-or-full, the rest partial), N = 4096, K = 7168, expected_m
    32 (see _check_masked_run)."""
    mm = torch.tensor([0, 64, 3, 17, 64, 1, 40, 63], dtype=torch.int32, device=DEV)
    _check_masked_run(mm, 64, 4096, 7168, seed, expected_m=32)


def _check_contiguous_run(m_indices, g, n, k, seed):
    """FP8 grouped-contiguous GEMM (B: g x [N, K]) into poisoned BF16, against the reference."""
    m = m_indices.numel()
    d = poisoned((m, n), torch.bfloat16, DEV)
    x, y = _rand((m, k), seed), _rand((g, n, k), seed + 1)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)
    r = torch.full((m, n), float("nan"), device=DEV)
    ref.ref_m_grouped_gemm_nt_contiguous(*a, *b, r, m_indices)
    _check_contiguous(d, r, m_indices)


def _check_masked_run(mm, m_max, n, k, seed, expected_m=None):
    """FP8 masked GEMM (masked_m = mm, expected_m = m_max unless given) into poisoned BF16: valid rows match the
    reference, rows past masked_m stay untouched (NaN)."""
    g = mm.numel()
    d = poisoned((g, m_max, n), torch.bfloat16, DEV)
    x, y = _rand((g, m_max, k), seed), _rand((g, n, k), seed + 1)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    dg.m_grouped_fp8_gemm_nt_masked(a, b, d, mm, expected_m=m_max if expected_m is None else expected_m)
    r = torch.full((g, m_max, n), float("nan"), device=DEV)
    ref.ref_m_grouped_gemm_nt_masked(*a, *b, r, mm)
    for gi, mg in enumerate(mm.tolist()):
        assert d[gi, mg:].float().isnan().all(), f"group {gi}: rows past masked_m written"
        if mg:
            _check(d[gi, :mg], r[gi, :mg])


@pytest.mark.parametrize("nk", NK, ids=[f"n{n}k{k}" for n, k in NK])
@pytest.mark.parametrize("m", [1, 64, 128, 4096, 37, 1000])
def test_fp8_gemm_nt(m, nk):
    n, k = nk
    _check_bf16_out(_rand((m, k), m * 7 + n), _rand((n, k), k))


@pytest.mark.parametrize("out", [torch.float32, torch.float8_e4m3fn])
def test_fp8_gemm_accumulate_and_fp8_out(out):
    m, n, k = 256, 4096, 7168
    x, y = _rand((m, k), 1), _rand((n, k), 2)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    r = torch.empty(m, n, device=DEV)
    ref.ref_gemm_nt(*a, *b, r)
    if out == torch.float32:
        c = torch.randn(m, n, device=DEV) * 30
        d = poisoned((m, n), out, DEV)
        dg.fp8_gemm_nt(a, b, d, c=c)
        _check(d, r + c)
        cb = c.bfloat16()
        dg.fp8_gemm_nt(a, b, d, c=cb)
        _check(d, r + cb.float())
    else:
        d = poisoned((m, n), out, DEV)
        dg.fp8_gemm_nt(a, b, d)
        assert dg.calc_diff(d.float(), r) < 2e-3


@pytest.mark.parametrize("m,n,k", [(1, 7168, 2048), (64, 2112, 7168), (4096, 4096, 7168), (333, 24576, 1536)])
def test_bf16_gemm_nt(m, n, k):
    x, y = _rand((m, k), 3), _rand((n, k), 4)
    d = poisoned((m, n), torch.bfloat16, DEV)
    dg.bf16_gemm_nt(x, y, d)
    _check(d, x.float() @ y.float().t())


def _group_sizes(g, mean, seed):
    gen = torch.Generator().manual_seed(seed)
    sizes = (torch.rand(g, generator=gen) * 2 * mean).long().tolist()
    sizes[0] = 0  # an empty expert
    return sizes


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize("g,mean,nk", [(4, 1024, (4096, 7168)), (8, 256, (7168, 2048)), (32, 96, (4096, 7168))])
def test_m_grouped_contiguous(g, mean, nk, fp8):
    n, k = nk
    m_indices = dg.testing.make_contiguous_m_indices(_group_sizes(g, mean, g), device=DEV)
    m = m_indices.numel()
    x, y = _rand((m, k), 5), _rand((g, n, k), 6)
    d = poisoned((m, n), torch.bfloat16, DEV)
    r = torch.full((m, n), float("nan"), device=DEV)
    if fp8:
        a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
        dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)
        ref.ref_m_grouped_gemm_nt_contiguous(*a, *b, r, m_indices)
    else:
        dg.m_grouped_bf16_gemm_nt_contiguous(x, y, d, m_indices)
        ref.ref_m_grouped_gemm_nt_contiguous(x, None, y, None, r, m_indices)
    _check_contiguous(d, r, m_indices)


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize("g,m_max,nk", [(1, 256, (4096, 7168)), (4, 128, (7168, 2048)),
                                        (8, 64, (4096, 7168)), (32, 32, (7168, 2048))])
def test_m_grouped_masked(g, m_max, nk, fp8):
    n, k = nk
    gen = torch.Generator().manual_seed(g + m_max)
    mm = torch.randint(0, m_max + 1, (g,), generator=gen, dtype=torch.int32)
    mm[0] = 0
    if g > 1:
        mm[1] = m_max
    masked_m = mm.to(DEV)
    x, y = _rand((g, m_max, k), 7), _rand((g, n, k), 8)
    d = poisoned((g, m_max, n), torch.bfloat16, DEV)
    r = torch.full((g, m_max, n), float("nan"), device=DEV)
    if fp8:
        a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
        dg.m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m=max(1, int(mm.float().mean())))
        ref.ref_m_grouped_gemm_nt_masked(*a, *b, r, masked_m)
    else:
        dg.m_grouped_bf16_gemm_nt_masked(x, y, d, masked_m, m_max // 2)
        ref.ref_m_grouped_gemm_nt_masked(x, None, y, None, r, masked_m)
    for gi, m in enumerate(mm.tolist()):
        assert d[gi, m:].float().isnan().all(), f"group {gi}: rows past masked_m written"
        if m:
            _check(d[gi, :m], r[gi, :m])


def test_cuda_graph_masked():
    g, m_max, n, k = 8, 64, 4096, 7168
    x, y = _rand((g, m_max, k), 9), _rand((g, n, k), 10)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    a = (a[0], dg.get_mn_major_tma_aligned_tensor(a[1]))
    masked_m = torch.full((g,), 16, dtype=torch.int32, device=DEV)
    d = torch.zeros(g, m_max, n, dtype=torch.bfloat16, device=DEV)
    dg.m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, 16)  # warm-up: compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dg.m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, 16)
    for trial in range(2):
        new = torch.randint(0, m_max + 1, (g,), generator=torch.Generator().manual_seed(trial), dtype=torch.int32)
        masked_m.copy_(new)
        x2 = _rand((g, m_max, k), 100 + trial)
        a2 = dg.per_token_cast_to_fp8(x2)
        a[0].copy_(a2[0])
        a[1].copy_(a2[1])
        d.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        r = torch.full((g, m_max, n), float("nan"), device=DEV)
        ref.ref_m_grouped_gemm_nt_masked(*a, *b, r, masked_m)
        for gi, m in enumerate(new.tolist()):
            assert d[gi, m:].float().isnan().all()
            if m:
                _check(d[gi, :m], r[gi, :m])


@pytest.mark.parametrize("epi", ["staged", "direct"])
@pytest.mark.parametrize("ksplit", ["1", "0"])
def test_cuda_graph_masked_replays(ksplit, epi):
    """200 replays of a captured masked GEMM (8 x 64 rows, N=4096, K=7168: where ci/gpu saw the
    intermittent launch failure with the K split), each bit-identical to the eager result; in a
    separate process, since a CUDA error is sticky and a broken pipeline can hang."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "repro_masked.py"
    env = dict(os.environ, DEEPGEMM_KSPLIT=ksplit, DEEPGEMM_EPILOGUE=epi)
    env.pop("REPRO_FORCE_STAGES", None)
    try:
        r = subprocess.run([sys.executable, str(script), "--one", "--replays", "200"], env=env,
                           capture_output=True, text=True, timeout=100)
    except subprocess.TimeoutExpired:
        pytest.fail("no result in 100 s: the kernel hangs")
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert "ok:" in r.stdout and (f"ksplit={ksplit}" in r.stdout), r.stdout


@pytest.mark.parametrize("swap", ["1", "2"])
@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("nk", [(2112, 7168), (7168, 2048), (24576, 1536), (1000, 512)], ids=lambda nk: f"n{nk[0]}k{nk[1]}")
def test_swap_ab_dense(m, nk, swap, monkeypatch):
    """DEEPGEMM_SWAP_AB=1|2: the swap-AB kernel for M <= 16, one or two K blocks in flight (BF16 out;
    FP32 out with C; FP8 out); N = 1000 ends on a partial 64-row tile."""
    monkeypatch.setenv("DEEPGEMM_SWAP_AB", swap)
    n, k = nk
    # distinct seeds: row 0 of B must not equal A's row
    _check_dense_outputs(_rand((m, k), 20 + m), _rand((n, k), 121))


@pytest.mark.parametrize("swap", ["1", "2"])
@pytest.mark.parametrize("g,m_max,expected", [(8, 16, 8), (32, 8, 4), (4, 64, 12)])
def test_swap_ab_masked(g, m_max, expected, swap, monkeypatch):
    """Swap-AB masked layout, including masked_m = 0 and masked_m above the hint (several row blocks)."""
    monkeypatch.setenv("DEEPGEMM_SWAP_AB", swap)
    n, k = 4096, 7168
    gen = torch.Generator().manual_seed(g)
    mm = torch.randint(0, m_max + 1, (g,), generator=gen, dtype=torch.int32)
    mm[0], mm[1] = 0, m_max
    _check_masked_run(mm.to(DEV), m_max, n, k, 22, expected_m=expected)


@pytest.mark.parametrize("epi", ["staged", "direct"])
def test_pipelined_fp8(epi, monkeypatch):
    """DEEPGEMM_PIPE=1: two K blocks in flight per consumer warpgroup (BM 64 and 128, with C, odd and
    small K block counts), dense and masked."""
    monkeypatch.setenv("DEEPGEMM_PIPE", "1")
    monkeypatch.setenv("DEEPGEMM_GEMV", "0")  # M <= 16 would take the small-M kernel
    monkeypatch.setenv("DEEPGEMM_KSPLIT", "0")  # BM = 64 would take the K split (the default) instead
    monkeypatch.setenv("DEEPGEMM_BN256", "0")  # the 128 x 256 tile (the large-M default) has no PIPE variant
    monkeypatch.setenv("DEEPGEMM_EPILOGUE", epi)
    for m, n, k in [(1, 7168, 16384), (64, 7168, 2048), (128, 2112, 7168), (1000, 4096, 7168), (3, 4096, 384),
                    (40, 2112, 128), (4096, 7168, 2048)]:
        _check_fp8_with_c(m, n, k, m + 1, n + 1)
    _check_masked_8x64(30)


def test_torch_compile_cuda():
    m, n, k = 128, 7168, 2048
    x, y = _rand((m, k), 11), _rand((n, k), 12)
    b = dg.per_block_cast_to_fp8(y)

    def f(x, b0, b1):
        a = dg.per_token_cast_to_fp8(x)
        d = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
        dg.fp8_gemm_nt(a, (b0, b1), d)
        return torch.relu(d)

    eager = f(x, *b)
    comp = torch.compile(f, fullgraph=True)(x, *b)
    assert dg.calc_diff(comp, eager) < 1e-6


def test_backends_and_cache_reuse(tmp_path):
    """NVRTC and nvcc produce working kernels; a second process finds them in the disk cache."""
    from deepgemm.jit import compiler
    script = (
        "import torch, deepgemm as dg\n"
        "from deepgemm.jit import compiler\n"
        "x = torch.randn(100, 1536, device='cuda', dtype=torch.bfloat16); y = torch.randn(2048, 1536, device='cuda', dtype=torch.bfloat16)\n"
        "a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)\n"
        "d = torch.full((100, 2048), float('nan'), device='cuda', dtype=torch.bfloat16)\n"
        "dg.fp8_gemm_nt(a, b, d)\n"
        "diff = dg.calc_diff(d, x.float() @ y.float().t())\n"
        "assert diff < 1e-3, diff\n"
        "print('RESULT', [(r.backend, round(r.seconds, 3)) for r in compiler.COMPILE_LOG])\n"
    )
    backends = ["nvcc"] + (["nvrtc"] if compiler._nvrtc() is not None else [])
    for be in backends:
        env = dict(os.environ, DEEPGEMM_CACHE_DIR=str(tmp_path / be), DEEPGEMM_JIT_BACKEND=be)
        outs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
                for _ in range(2)]
        for o in outs:
            assert o.returncode == 0, o.stderr[-2000:]
        first, second = (o.stdout.split("RESULT")[-1] for o in outs)
        assert be in first and "cache" in second and be not in second, (first, second)


@pytest.mark.parametrize("ksplit", ["0", "1"])
@pytest.mark.parametrize("epi", ["direct", "staged"])
@pytest.mark.parametrize("num_sms", [132, 77])
def test_epilogues_and_block_sizes(epi, num_sms, ksplit, monkeypatch):
    """Both BF16 epilogues, with C, with and without the K split of small-M tiles; other SM counts
    give other BN (tiles straddling B scale blocks)."""
    monkeypatch.setenv("DEEPGEMM_EPILOGUE", epi)
    monkeypatch.setenv("DEEPGEMM_KSPLIT", ksplit)
    monkeypatch.setenv("DEEPGEMM_GEMV", "0")  # M = 3 would take the small-M kernel
    old = dg.get_num_sms()
    dg.set_num_sms(num_sms)
    try:
        for m, n, k in [(1000, 2112, 7168), (64, 7168, 2048), (129, 24576, 1536), (3, 4096, 384), (40, 2112, 128)]:
            _check_fp8_with_c(m, n, k, m, n)
    finally:
        dg.set_num_sms(old)


@pytest.mark.parametrize("epi", ["staged", "direct"])
def test_multicast_dense(epi, monkeypatch):
    """DEEPGEMM_MULTICAST=1: 2-CTA clusters sharing B (dense, BM = 128, an even number of M blocks) or A
    (pairs along N: small M, odd M blocks, masked) through TMA multicast: FP8 with BF16 / FP32 (+ C) / FP8
    output, BF16 GEMM, a partial last N tile (N = 2112), a graph replay, masked groups with empty ones."""
    from deepgemm.jit import kernels
    monkeypatch.setenv("DEEPGEMM_MULTICAST", "1")
    monkeypatch.setenv("DEEPGEMM_EPILOGUE", epi)
    monkeypatch.setenv("DEEPGEMM_BN256", "0")  # neither the 128 x 256 tile nor the TMA store has a multicast variant
    monkeypatch.setenv("DEEPGEMM_TMA_STORE", "0")
    monkeypatch.setenv("DEEPGEMM_SPLIT_K", "0")  # split-K (default auto at M <= 128) has no multicast variant
    for m, n, k in [(4096, 7168, 2048), (4096, 2112, 7168), (2000, 4096, 512)]:
        x, y = _rand((m, k), m + n), _rand((n, k), k + 3)
        db = poisoned((m, n), torch.bfloat16, DEV)
        assert kernels.make_config("dense", True, db, None, n, k, m, 1).mcast == 1
        _check_dense_outputs(x, y)
        assert kernels.make_config("dense", False, db, None, n, k, m, 1).mcast == 1
        dg.bf16_gemm_nt(x, y, db)
        _check(db, x.float() @ y.float().t())
    m, n, k = 4096, 4096, 7168  # graph replays: bit-identical to the eager result
    x, y = _rand((m, k), 5), _rand((n, k), 6)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    d = poisoned((m, n), torch.bfloat16, DEV)
    dg.fp8_gemm_nt(a, b, d)
    _assert_replays_match(lambda: dg.fp8_gemm_nt(a, b, d), d, 20)
    # small M, and M blocks that do not pair up: pairs along N share A (mcast 2), K split included
    for m, n, k in [(1, 4096, 7168), (5, 7168, 2048), (64, 7168, 2048), (100, 2112, 7168), (3900, 4096, 7168)]:
        d = poisoned((m, n), torch.bfloat16, DEV)
        cfg = kernels.make_config("dense", True, d, None, n, k, m, 1)
        assert cfg.mcast == (2 if -(-n // cfg.bn) % 2 == 0 else 0), cfg
        _check_dense_outputs(_rand((m, k), m + 11), _rand((n, k), n + 13))
    _check_masked_8x64(40)  # masked, with empty groups


@pytest.mark.parametrize("mode,epi", [("1", "staged"), ("1", "direct"), ("2", "staged"), ("2", "direct")])
def test_bn256_wide_tiles(mode, epi, monkeypatch):
    """DEEPGEMM_BN256=1: FP8 128 x 256 tiles (each consumer warpgroup: 64 rows x two 128-column halves);
    =2: the same with A read into registers once per K block (ldmatrix) for both halves' WGMMAs.
    The large DeepSeek-V3 shapes the model gives them; forced (DEEPGEMM_BLOCKS=128x256) on unaligned M and N
    (a last tile whose second half lies past N, N not a multiple of 128, M not a multiple of 128, a single
    tile) with BF16 / FP32 (+ C) / FP8 outputs; grouped contiguous (padding rows untouched) and masked."""
    from deepgemm.jit import kernels
    monkeypatch.setenv("DEEPGEMM_BN256", mode)
    monkeypatch.setenv("DEEPGEMM_EPILOGUE", epi)
    for n, k in NK[1:]:  # N = 2112 keeps 128 x 112 (fewer waves)
        m = 4096
        d = poisoned((m, n), torch.bfloat16, DEV)
        cfg = kernels.make_config("dense", True, d, None, n, k, m, 1)
        assert cfg.bn == 256 and cfg.rs == (mode == "2")
        built = kernels.get_kernel(cfg)[1]
        # =1 is built as chosen; =2 may spill under NVRTC (with the staged epilogue: H200 runs 9 and 10 saw it at
        # N = 24576 K = 1536 and N = 7168 K = 16384, not every time) and then falls back to the same tile with A
        # from shared memory
        assert built == cfg or (mode == "2" and built == replace(cfg, rs=0)), built
        _check_bf16_out(_rand((m, k), n + 1), _rand((n, k), k + 2), d)
    monkeypatch.setenv("DEEPGEMM_BLOCKS", "128x256")
    for m, n, k in [(1000, 2112, 7168), (129, 4104, 1536), (300, 384, 256), (200, 256, 128)]:
        assert kernels.make_config("dense", True, poisoned((1, 1), torch.bfloat16, DEV), None, n, k, m, 1).bn == 256
        _check_dense_outputs(_rand((m, k), m + 5), _rand((n, k), n + 7))
    for g, mean, (n, k), force in [(4, 1024, (4096, 7168), False), (8, 256, (7168, 2048), True)]:
        # the model's pick; the smaller case (the model gives it BN = 120) forced
        monkeypatch.setenv("DEEPGEMM_BLOCKS", "128x256") if force else monkeypatch.delenv("DEEPGEMM_BLOCKS", raising=False)
        m_indices = dg.testing.make_contiguous_m_indices(_group_sizes(g, mean, g + 50), device=DEV)
        m = m_indices.numel()
        assert kernels.make_config("contiguous", True, poisoned((1, 1), torch.bfloat16, DEV), None, n, k, m, 1).bn == 256
        _check_contiguous_run(m_indices, g, n, k, 15)
    monkeypatch.delenv("DEEPGEMM_BLOCKS", raising=False)
    g, m_max, n, k = 4, 256, 4096, 7168
    assert kernels.make_config("masked", True, poisoned((1, 1), torch.bfloat16, DEV), None, n, k, m_max, g).bn == 256
    _check_masked_run(torch.tensor([0, 256, 131, 7], dtype=torch.int32, device=DEV), m_max, n, k, 21)


@pytest.mark.parametrize("epi", ["staged", "direct"])
def test_bn192_tiles(epi, monkeypatch):
    """FP8 128 x 192 tiles (plain main loop; a tile starts on a multiple of 64 and spans two B scale blocks at
    most): the model's pick at M = 1024, N = 3072 (K = 7168; K = 2048 with the TMA store), forced on unaligned M
    and N (N < 192, N not a multiple of 64) with BF16 / FP32 (+ C) / FP8 outputs, grouped contiguous (padding
    rows untouched) and masked (masked_m of 0 included)."""
    from deepgemm.jit import kernels
    monkeypatch.setenv("DEEPGEMM_EPILOGUE", epi)
    for k in (7168, 2048):
        d = poisoned((1024, 3072), torch.bfloat16, DEV)
        cfg = kernels.make_config("dense", True, d, None, 3072, k, 1024, 1)
        assert (cfg.bm, cfg.bn, cfg.rs) == (128, 192, 0)
        _check_bf16_out(_rand((1024, k), k + 1), _rand((3072, k), k + 2), d)
    monkeypatch.setenv("DEEPGEMM_BLOCKS", "128x192")
    for m, n, k in [(1000, 2112, 7168), (129, 3080, 1536), (300, 136, 256), (200, 448, 128)]:
        assert kernels.make_config("dense", True, poisoned((1, 1), torch.bfloat16, DEV), None, n, k, m, 1).bn == 192
        _check_dense_outputs(_rand((m, k), m + 5), _rand((n, k), n + 7))
    m_indices = dg.testing.make_contiguous_m_indices(_group_sizes(4, 512, 77), device=DEV)
    _check_contiguous_run(m_indices, 4, 2112, 7168, 31)
    _check_masked_run(torch.tensor([0, 256, 131, 7], dtype=torch.int32, device=DEV), 256, 2112, 7168, 33)


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize("bn256", ["0", "1"])
def test_tma_store_grouped(bn256, fp8, monkeypatch):
    """DEEPGEMM_TMA_STORE=1 on the grouped layouts: whole 64-row boxes leave through TMA stores, boxes holding
    padding rows (contiguous: groups of 0-300 rows padded to 128) or rows past masked_m (masked: 0-256 of 256,
    none a multiple of 64 but the full and empty ones) are stored directly, so those rows stay NaN; N = 7168,
    K = 2048 (the TMA-store default), 128 x 128 and 128 x 256 tiles, 9 SMs (several tiles per CTA)."""
    from deepgemm.jit import kernels
    monkeypatch.setenv("DEEPGEMM_TMA_STORE", "1")
    monkeypatch.setenv("DEEPGEMM_BN256", bn256)
    n, k = 7168, 2048
    m_indices = dg.testing.make_contiguous_m_indices([300, 0, 64, 1, 129, 200, 128, 63], device=DEV)
    m, g = m_indices.numel(), 8
    x, y = _rand((m, k), 71), _rand((g, n, k), 72)
    mm = torch.tensor([256, 0, 100, 1, 64, 129, 250, 37], dtype=torch.int32)
    xm = _rand((g, 256, k), 73)
    old = dg.get_num_sms()
    dg.set_num_sms(9)
    try:
        d = poisoned((m, n), torch.bfloat16, DEV)
        r = torch.full((m, n), float("nan"), device=DEV)
        assert kernels.make_config("contiguous", fp8, d, None, n, k, m, 1).tstore == 1
        dm = poisoned((g, 256, n), torch.bfloat16, DEV)
        rm = torch.full((g, 256, n), float("nan"), device=DEV)
        assert kernels.make_config("masked", fp8, dm, None, n, k, 128, g).tstore == 1
        if fp8:
            a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
            dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)
            ref.ref_m_grouped_gemm_nt_contiguous(*a, *b, r, m_indices)
            am = dg.per_token_cast_to_fp8(xm)
            dg.m_grouped_fp8_gemm_nt_masked(am, b, dm, mm.to(DEV), expected_m=128)
            ref.ref_m_grouped_gemm_nt_masked(*am, *b, rm, mm.to(DEV))
        else:
            dg.m_grouped_bf16_gemm_nt_contiguous(x, y, d, m_indices)
            ref.ref_m_grouped_gemm_nt_contiguous(x, None, y, None, r, m_indices)
            dg.m_grouped_bf16_gemm_nt_masked(xm, y, dm, mm.to(DEV), 128)
            ref.ref_m_grouped_gemm_nt_masked(xm, None, y, None, rm, mm.to(DEV))
    finally:
        dg.set_num_sms(old)
    _check_contiguous(d, r, m_indices)
    for gi, mg in enumerate(mm.tolist()):
        assert dm[gi, mg:].float().isnan().all(), f"group {gi}: rows past masked_m written"
        if mg:
            _check(dm[gi, :mg], rm[gi, :mg])


@pytest.mark.parametrize("bn256", ["0", "1", "2"])
def test_tma_store_epilogue(bn256, monkeypatch):
    """DEEPGEMM_TMA_STORE=1: dense BF16 outputs leave through TMA stores of swizzled 64 x 64 boxes (clipped at
    M and N). The large DeepSeek-V3 shapes (128 x 128, or 128 x 256 with DEEPGEMM_BN256=1); unaligned M and N
    (partial boxes, boxes wholly past N) with BF16 and FP32 C; the K split (BM = 64, warpgroup 0 stores); a BF16
    GEMM; several tiles per CTA (9 SMs) and graph replays bit-identical to the eager result."""
    from deepgemm.jit import kernels
    monkeypatch.setenv("DEEPGEMM_TMA_STORE", "1")
    monkeypatch.setenv("DEEPGEMM_BN256", bn256)
    db = poisoned((1, 1), torch.bfloat16, DEV)
    for n, k in NK[1:]:
        m = 4096
        assert kernels.make_config("dense", True, db, None, n, k, m, 1).tstore == 1
        _check_bf16_out(_rand((m, k), n + 31), _rand((n, k), k + 32))
    for blocks, (m, n, k) in [("128x128", (1000, 4104, 1536)), ("128x64", (129, 2112, 7168)),
                              ("128x256", (300, 384, 256)), ("64x128", (64, 7168, 2048)), ("64x64", (37, 200, 128))]:
        monkeypatch.setenv("DEEPGEMM_BLOCKS", blocks)
        cfg = kernels.make_config("dense", True, db, None, n, k, m, 1)
        assert cfg.tstore == 1 and cfg.ksplit == (cfg.bm == 64 and k >= 256), cfg
        _check_fp8_with_c(m, n, k, m + 3, n + 4)
        x, y = _rand((m, k), m + 41), _rand((n, k), n + 42)
        a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
        cb = torch.randn(m, n, device=DEV).to(torch.bfloat16)
        d = poisoned((m, n), torch.bfloat16, DEV)
        dg.fp8_gemm_nt(a, b, d, c=cb)
        r = torch.empty(m, n, device=DEV)
        ref.ref_gemm_nt(*a, *b, r, cb.float())
        _check(d, r)
    monkeypatch.setenv("DEEPGEMM_BLOCKS", "128x128")
    m, n, k = 1000, 4096, 7168  # BF16 GEMM
    x, y = _rand((m, k), 51), _rand((n, k), 52)
    assert kernels.make_config("dense", False, db, None, n, k, m, 1).tstore == 1
    d = poisoned((m, n), torch.bfloat16, DEV)
    dg.bf16_gemm_nt(x, y, d)
    _check(d, x.float() @ y.float().t())
    monkeypatch.delenv("DEEPGEMM_BLOCKS")
    old = dg.get_num_sms()
    dg.set_num_sms(9)  # many tiles per CTA: the boxes are rewritten only after their stores have read them
    try:
        m, n, k = 4096, 4096, 512
        x, y = _rand((m, k), 61), _rand((n, k), 62)
        a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
        d = poisoned((m, n), torch.bfloat16, DEV)
        assert kernels.make_config("dense", True, d, None, n, k, m, 1).tstore == 1
        dg.fp8_gemm_nt(a, b, d)
        r = torch.empty(m, n, device=DEV)
        ref.ref_gemm_nt(*a, *b, r)
        _check(d, r)
        _assert_replays_match(lambda: dg.fp8_gemm_nt(a, b, d), d, 10)
    finally:
        dg.set_num_sms(old)


def test_min_sms_grid(monkeypatch):
    """DEEPGEMM_MIN_SMS=1: the persistent grid shrinks to ceil(tiles / waves) CTAs (N = 2112: 122 of 132 SMs
    at M = 4096); results unchanged, dense and grouped contiguous."""
    from deepgemm.jit import kernels
    monkeypatch.setenv("DEEPGEMM_MIN_SMS", "1")
    m, n, k = 4096, 2112, 7168
    cfg = kernels.make_config("dense", True, poisoned((1, 1), torch.bfloat16, DEV), None, n, k, m, 1)
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn)
    assert kernels.launch_grid(cfg, tiles, dg.get_num_sms()) < min(dg.get_num_sms(), tiles) or dg.get_num_sms() != 132
    _check_fp8_with_c(m, n, k, 71, 72)
    g, n, k = 4, 4096, 7168
    m_indices = dg.testing.make_contiguous_m_indices(_group_sizes(g, 700, 73), device=DEV)
    _check_contiguous_run(m_indices, g, n, k, 74)


# ---- DEEPGEMM_SPLIT_K: cross-CTA split-K at M <= 128 ----------------------------------------------------
def _split_run(m, n, k, seed, out=torch.bfloat16, c_dtype=None):
    """One FP8 dense GEMM into a poisoned output (FP32 / BF16 C optional); returns (d, reference, config)."""
    from deepgemm.jit import kernels
    x, y = _rand((m, k), seed), _rand((n, k), seed + 1)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    c = None if c_dtype is None else torch.randn(m, n, device=DEV).to(c_dtype)
    d = poisoned((m, n), out, DEV)
    dg.fp8_gemm_nt(a, b, d, c=c)
    r = torch.empty(m, n, device=DEV)
    ref.ref_gemm_nt(*a, *b, r, None if c is None else c.float())
    return d, r, kernels.make_config("dense", True, d, c, n, k, m, 1), (a, b, c)


@pytest.mark.parametrize("mode", ["auto", "4"])
@pytest.mark.parametrize("nk", NK, ids=[f"n{n}k{k}" for n, k in NK])
@pytest.mark.parametrize("m", [1, 24, 64, 128])
def test_split_k_dense(m, nk, mode, monkeypatch):
    """DEEPGEMM_SPLIT_K on the small-M DeepSeek-V3 shapes: S = 4 always splits, auto where the model predicts a
    gain; outputs poisoned, compared with the reference."""
    monkeypatch.setenv("DEEPGEMM_SPLIT_K", mode)
    monkeypatch.setenv("DEEPGEMM_GEMV", "0")  # M = 1 would take the small-M kernel under auto
    n, k = nk
    d, r, cfg, _ = _split_run(m, n, k, m * 3 + n)
    assert cfg.splitk == (4 if mode == "4" else cfg.splitk) and (mode == "auto" or cfg.splitk > 1)
    _check(d, r)


@pytest.mark.parametrize("m,n,k,mode,out,c_dtype", [
    (37, 1000, 7168, "3", torch.bfloat16, None),           # unaligned M and N; 56 K blocks = 18 + 19 + 19
    (64, 2120, 896, "5", torch.bfloat16, torch.float32),    # 7 K blocks in 5 slices (1 or 2 each), FP32 C
    (64, 7168, 2048, "16", torch.bfloat16, None),           # one K block per slice: a K-split warpgroup idles
    (128, 4096, 7168, "7", torch.float32, torch.float32),   # FP32 out + C, BM = 128 or two M blocks
    (128, 7168, 2048, "3", torch.bfloat16, torch.bfloat16), # BF16 C
    (1, 4096, 7168, "8", torch.float8_e4m3fn, None),        # FP8 out
    (100, 24, 384, "2", torch.bfloat16, torch.float32),     # one tile, 3 K blocks
])
def test_split_k_edges(m, n, k, mode, out, c_dtype, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_SPLIT_K", mode)
    d, r, cfg, _ = _split_run(m, n, k, n + k, out, c_dtype)
    assert cfg.splitk == min(int(mode), k // 128)
    if out == torch.float8_e4m3fn:
        assert not d.float().isnan().any()
        assert dg.calc_diff(d.float(), r.clamp(-448, 448)) < 2e-3
    else:
        _check(d, r)


@pytest.mark.parametrize("mode", ["auto", "7"])
def test_split_k_deterministic_and_graphs(mode, monkeypatch):
    """Bit-identical across eager runs, across grids of 132 and 61 SMs (other arrival orders, same slices:
    S and the tile forced), with the cached workspace poisoned between calls (each launch rewrites every slot
    it reads), and over 30 CUDA-graph replays into a poisoned output; the tile counters are back at zero."""
    from deepgemm.jit import kernels
    monkeypatch.setenv("DEEPGEMM_SPLIT_K", mode)
    m, n, k = 64, 2112, 7168
    d, r, cfg, (a, b, _) = _split_run(m, n, k, 5)
    assert cfg.splitk > 1
    _check(d, r)
    monkeypatch.setenv("DEEPGEMM_BLOCKS", f"{cfg.bm}x{cfg.bn}")
    monkeypatch.setenv("DEEPGEMM_SPLIT_K", str(cfg.splitk))
    first = d.clone()
    old = dg.get_num_sms()
    try:
        for sms in (132, 61, 132):
            dg.set_num_sms(sms)
            for ws, ctr in kernels._workspaces.values():
                ws.fill_(float("nan"))
            d.fill_(float("nan"))
            dg.fp8_gemm_nt(a, b, d)
            torch.cuda.synchronize()
            assert torch.equal(d, first), sms
        dg.set_num_sms(old)
        _assert_replays_match(lambda: dg.fp8_gemm_nt(a, b, d), d, 30)
    finally:
        dg.set_num_sms(old)
    assert all(int(ctr.abs().sum()) == 0 for _, ctr in kernels._workspaces.values())


def _split_same_without(switch, cfg, a, b, d, monkeypatch):
    """d (a split-K GEMM under switch=1) equals, bit for bit, the call under switch=0 with cfg's tiles and slices
    forced; then the switch=1 call captured in a CUDA graph reproduces d over 10 replays."""
    monkeypatch.setenv(switch, "0")
    monkeypatch.setenv("DEEPGEMM_BLOCKS", f"{cfg.bm}x{cfg.bn}")
    monkeypatch.setenv("DEEPGEMM_SPLIT_K", str(cfg.splitk))
    plain = poisoned(tuple(d.shape), torch.bfloat16, DEV)
    dg.fp8_gemm_nt(a, b, plain)
    torch.cuda.synchronize()
    assert torch.equal(plain, d)
    monkeypatch.setenv(switch, "1")
    _assert_replays_match(lambda: dg.fp8_gemm_nt(a, b, d), d, 10)


@pytest.mark.parametrize("m,n,k,blocks,s", [
    (128, 7168, 16384, None, "auto"),  # the model's pick under multicast
    (128, 4096, 7168, None, "auto"),
    (64, 2112, 7168, None, "auto"),
    (128, 2112, 7168, "128x48", "3"),  # 44 N blocks, K blocks 56 = 18 + 19 + 19
    (100, 4096, 7168, "128x64", "4"),  # A box of 112 rows: two 56-row halves, rows past M zero-filled
    (37, 1000, 7168, "64x64", "5"),    # unaligned M and N: 16 N blocks, the last one partial
])
def test_split_k_multicast(m, n, k, blocks, s, monkeypatch):
    """DEEPGEMM_MULTICAST=1 with split-K: the two CTAs of a cluster take N blocks 2p and 2p + 1 of the same M block
    and K slice and share A's boxes through TMA multicast. Same tiles, slices and summation order as the plain
    split-K kernel, so bit-identical to it; poisoned output vs the reference; CUDA-graph replays."""
    from deepgemm.jit import kernels
    monkeypatch.setenv("DEEPGEMM_MULTICAST", "1")
    monkeypatch.setenv("DEEPGEMM_SPLIT_K", s)
    if blocks:
        monkeypatch.setenv("DEEPGEMM_BLOCKS", blocks)
    d, r, cfg, (a, b, _) = _split_run(m, n, k, m + n + k)
    assert cfg.splitk > 1 and cfg.mcast == 2, cfg
    assert kernels.get_kernel(cfg)[1].mcast == 2  # no spill fallback
    _check(d, r)
    _split_same_without("DEEPGEMM_MULTICAST", cfg, a, b, d, monkeypatch)
    assert all(int(ctr.abs().sum()) == 0 for _, ctr in kernels._workspaces.values())


@pytest.mark.parametrize("m,n,k,blocks,s,mcast", [
    (128, 7168, 16384, None, "auto", "0"),  # the model's tiles: 64 K blocks per slice, 32 pairs
    (64, 2112, 7168, None, "auto", "0"),     # BM = 64: the K split's two warpgroups each pair their blocks
    (128, 2112, 7168, "128x48", "3", "0"),  # 18 / 19 / 19 K blocks: an odd last block
    (37, 1000, 7168, "64x64", "5", "1"),    # unaligned M and N, with multicast of A
    (100, 24, 384, "64x24", "2", "0"),      # one tile, 1 + 2 K blocks
])
def test_split_k_pipe(m, n, k, blocks, s, mcast, monkeypatch):
    """DEEPGEMM_PIPE=1 with split-K: each consumer warpgroup takes its K blocks in pairs, the second's WGMMAs in
    flight while the first is promoted. Same promotions in the same order, so bit-identical to PIPE=0 with the same
    tiles and slices; poisoned output vs the reference; CUDA-graph replays."""
    from deepgemm.jit import kernels
    monkeypatch.setenv("DEEPGEMM_PIPE", "1")
    monkeypatch.setenv("DEEPGEMM_MULTICAST", mcast)
    monkeypatch.setenv("DEEPGEMM_SPLIT_K", s)
    if blocks:
        monkeypatch.setenv("DEEPGEMM_BLOCKS", blocks)
    d, r, cfg, (a, b, _) = _split_run(m, n, k, m + 2 * n + k)
    assert cfg.splitk > 1 and cfg.pipe == 1 and cfg.mcast == (2 if mcast == "1" else 0), cfg
    assert kernels.get_kernel(cfg)[1].pipe == 1  # no spill fallback
    _check(d, r)
    _split_same_without("DEEPGEMM_PIPE", cfg, a, b, d, monkeypatch)


def test_split_k_workspace_first_made_in_capture(monkeypatch):
    """A workspace first needed while a CUDA graph is captured: the call gets its own (its counters' zeroing is
    captured too); replays and a later eager call (which makes the cached one) are bit-identical."""
    from deepgemm.jit import kernels
    monkeypatch.setenv("DEEPGEMM_SPLIT_K", "6")
    m, n, k = 64, 4096, 7168
    x, y = _rand((m, k), 11), _rand((n, k), 12)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    cfg = kernels.make_config("dense", True, poisoned((1, 1), torch.bfloat16, DEV), None, n, k, m, 1)
    kernels.get_kernel(cfg)  # compile outside the capture
    monkeypatch.setattr(kernels, "_workspaces", {})
    d = poisoned((m, n), torch.bfloat16, DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        dg.fp8_gemm_nt(a, b, d)
    assert kernels._workspaces == {}
    graph.replay()
    torch.cuda.synchronize()
    r = torch.empty(m, n, device=DEV)
    ref.ref_gemm_nt(*a, *b, r)
    _check(d, r)
    first = d.clone()
    for _ in range(5):
        d.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(d, first)
    d.fill_(float("nan"))
    dg.fp8_gemm_nt(a, b, d)
    torch.cuda.synchronize()
    assert torch.equal(d, first) and len(kernels._workspaces) == 1


# ---- DEEPGEMM_PEEL: the last M block as a GEMM of its own ------------------------------------------------
@pytest.mark.parametrize("m,n,k,mode", [
    (4096, 2112, 7168, "auto"),   # the model peels: 527 + 17 tiles, 4 waves + a small-M GEMM instead of 5
    (4000, 2112, 7168, "auto"),   # unaligned M: the peeled GEMM has 32 rows
    (384, 24576, 1536, "1"),      # forced where auto does not: two M blocks and a split-K tail of 128 rows
    (3000, 7168, 2048, "1"),      # 128 x 256 tiles (TMA store), a 56-row tail
])
def test_peel_tail(m, n, k, mode, monkeypatch):
    """Rows [0, r) and [r, M) in two launches: the outputs (BF16, FP32 with C, FP8) match the reference, and a
    captured CUDA graph of the pair reproduces the eager result over 10 replays; DEEPGEMM_PEEL=0: one launch."""
    from deepgemm.jit import kernels
    monkeypatch.setenv("DEEPGEMM_PEEL", mode)
    launches = []
    real = kernels._gemm_nt_once

    def counted(cfg, a, *rest):
        launches.append(a.shape[0])
        real(cfg, a, *rest)
    monkeypatch.setattr(kernels, "_gemm_nt_once", counted)
    x, y = _rand((m, k), m + 11), _rand((n, k), n + 13)
    _check_dense_outputs(x, y)
    r = dg.ceil_div(m, 128) * 128 - 128
    assert launches == [r, m - r] * 3, launches
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    d = poisoned((m, n), torch.bfloat16, DEV)
    dg.fp8_gemm_nt(a, b, d)
    _assert_replays_match(lambda: dg.fp8_gemm_nt(a, b, d), d, 10)
    monkeypatch.setenv("DEEPGEMM_PEEL", "0")
    launches.clear()
    dg.fp8_gemm_nt(a, b, d)
    assert launches == [m]


@pytest.mark.parametrize("m,n,k,stages", [(64, 4096, 7168, 16), (1000, 2112, 1024, 1), (128, 7168, 16384, 3),
                                          (1000, 3072, 2048, 2)])
def test_forced_stages(m, n, k, stages, monkeypatch):
    """DEEPGEMM_STAGES: a ring deeper than the default cap (16, with the K split), a single stage (128 x 64, TMA
    store), an odd depth under split-K (128 x 112, 2 slices), two stages of the 128 x 192 tile: every output type
    still matches the reference."""
    from deepgemm.jit import kernels
    monkeypatch.setenv("DEEPGEMM_STAGES", str(stages))
    cfg = kernels.make_config("dense", True, poisoned((1, 1), torch.bfloat16, DEV), None, n, k, m, 1)
    assert cfg.stages == stages
    _check_dense_outputs(_rand((m, k), m + 3), _rand((n, k), n + 4))
