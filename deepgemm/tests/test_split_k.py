"""DEEPGEMM_SPLIT_K (cross-CTA split-K for FP8 dense GEMMs at M <= 128) on the CPU: the switch's parsing and
config, the generated source, the slice bounds, a Python emulation of the kernel's slice / counter / reduce
protocol (sm90_gemm.cuh, SPLITK) and, with nvcc, ptxas' report of every kernel the switch builds."""
import random
import re

import pytest
import torch

import deepgemm as dg
from deepgemm import ref
from deepgemm.jit import compiler, kernels

D = torch.empty(1, 1, dtype=torch.bfloat16)
NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def _cfg(n, k, m, env="auto", out=torch.bfloat16, ct=None, kind="dense", fp8=True, blocks="", num_sms=132, mcast="0",
         pipe=kernels.PIPE_DEFAULT):
    return kernels._make_config(kind, fp8, out, ct, n, k, m, 1, num_sms, "staged", "1", blocks_env=blocks,
                                split_k_env=env, mcast_env=mcast, pipe_env=pipe)


def test_default_auto_and_parsing(monkeypatch):
    """Unset (default "auto"): the config equals auto's; "0" never splits; bad values raise a ValueError naming
    the variable."""
    monkeypatch.delenv("DEEPGEMM_SPLIT_K", raising=False)
    assert kernels.SPLIT_K_DEFAULT == "auto"
    for m in (1, 64, 128):
        for n, k in NK:
            cfg = kernels.make_config("dense", True, D, None, n, k, m, 1)
            assert cfg == _cfg(n, k, m, env="auto") and _cfg(n, k, m, env="0").splitk == 0
    for bad in ("yes", "-2", "2.5", ""):
        with pytest.raises(ValueError, match="DEEPGEMM_SPLIT_K"):
            _cfg(2112, 7168, 64, env=bad)


def test_split_config(monkeypatch):
    """On: FP8 dense at M <= 128 only; the direct epilogue, no TMA store (set in the environment and ignored);
    PIPE pairs the K blocks; multicast of A where the N blocks pair up; S capped at the K blocks and SPLIT_K_MAX;
    BM = 64 keeps the K split between two consumer warpgroups; DEEPGEMM_BLOCKS forces the tile."""
    monkeypatch.setenv("DEEPGEMM_SPLIT_K", "8")
    for var, val in (("DEEPGEMM_TMA_STORE", "1"), ("DEEPGEMM_PIPE", "1"), ("DEEPGEMM_MULTICAST", "1")):
        monkeypatch.setenv(var, val)
    cfg = kernels.make_config("dense", True, D, None, 7168, 2048, 64, 1)
    assert (cfg.splitk, cfg.epi, cfg.tstore, cfg.pipe, cfg.mcast) == (8, 0, 0, 1, 2) and -(-7168 // cfg.bn) % 2 == 0
    assert _cfg(7168, 2048, 64, env="8", blocks="64x112", mcast="1").mcast == 2  # 64 N blocks pair up
    assert _cfg(7168, 2048, 64, env="8", blocks="64x96", mcast="1").mcast == 0  # 75 do not
    assert _cfg(7168, 2048, 64, env="8", blocks="64x112").mcast == 0  # multicast off
    assert cfg.bm == 64 and cfg.ksplit == 1 and cfg.stages % 2 == 0
    assert kernels.make_config("dense", True, D, None, 7168, 2048, 129, 1).splitk == 0  # M > 128
    assert kernels.make_config("masked", True, D, None, 7168, 2048, 64, 4).splitk == 0
    assert kernels.make_config("contiguous", True, D, None, 7168, 2048, 64, 1).splitk == 0
    assert kernels.make_config("dense", False, D, None, 7168, 2048, 64, 1).splitk == 0  # BF16 GEMM
    assert _cfg(7168, 512, 64, env="8").splitk == 4  # 4 K blocks
    assert _cfg(7168, 16384, 64, env="99").splitk == kernels.SPLIT_K_MAX
    assert _cfg(7168, 2048, 64, env="1").splitk == 0 and _cfg(7168, 128, 64, env="auto").splitk == 0
    forced = _cfg(7168, 2048, 128, env="4", blocks="128x128")
    assert (forced.bm, forced.bn, forced.splitk, forced.ksplit) == (128, 128, 4, 0)
    with pytest.raises(ValueError, match="DEEPGEMM_BLOCKS"):
        _cfg(7168, 2048, 128, env="4", blocks="128x256")
    # the workspace holds every (tile, slice) unit's partial; the grid is sized by units
    assert kernels.launch_grid(forced, 56 * 4, 132) == 132


def test_auto_picks():
    """auto splits where the small-M model predicts >= 1 / SPLIT_K_GAIN (the A-heavy, long-K shapes) and leaves
    the wide-N or short-K shapes alone (>= 128 tiles without it)."""
    picks = {(m, n, k): kernels.choose_split_k(m, n, k, 132) for m in (64, 128) for n, k in NK}
    for (m, n, k), p in picks.items():
        if p is None:
            continue
        bm, bn, s = p
        tiles = -(-m // bm) * -(-n // bn)
        assert 2 <= s <= min(k // 128, kernels.SPLIT_K_MAX) and tiles * s <= 132, (m, n, k, p)
        plain = kernels.small_m_time(m, n, k, 132, *kernels.choose_blocks(m, n, 1, 132))
        assert kernels.small_m_time(m, n, k, 132, bm, bn, s) < kernels.SPLIT_K_GAIN * plain
    # run 10 (H200): the splits that won (N = 2112, and K = 16384 at M = 128) stay, those that lost go
    assert all(picks[s] is not None for s in ((64, 2112, 7168), (128, 2112, 7168), (128, 7168, 16384)))
    assert all(picks[s] is None for s in ((64, 4096, 7168), (128, 4096, 7168), (64, 7168, 16384)))
    assert picks[64, 32768, 512] is None and picks[128, 24576, 1536] is None


def test_auto_splits_thin_tiles_above_the_small_m_kernel():
    """Above GEMV_MAX_M, where the unsplit tile would be 16 wide (N = 2112, M = 17-32) and K at least 16 blocks deep,
    auto splits on any modelled gain (run 22: the model rated these splits 0.89-0.92, they ran 1.3-1.4x faster); at M <= 16 it does not (the
    small-M kernel takes these shapes), nor where the unsplit tile is wider (N = 4096)."""
    for m in (17, 24, 32):
        assert kernels.choose_blocks(m, 2112, 1, 132)[1] == kernels.SPLIT_K_THIN_BN
        bm, bn, s = kernels.choose_split_k(m, 2112, 7168, 132)
        plain = kernels.small_m_time(m, 2112, 7168, 132, *kernels.choose_blocks(m, 2112, 1, 132))
        assert kernels.SPLIT_K_GAIN * plain <= kernels.small_m_time(m, 2112, 7168, 132, bm, bn, s) < plain
        assert kernels.choose_split_k(m, 4096, 7168, 132) is None
    assert kernels.choose_split_k(16, 2112, 7168, 132) is None
    assert kernels.choose_split_k(64, 512, 1536, 132) is None  # 12 K blocks: too short a chain (run 22: 0.94x)
    assert kernels.choose_split_k(64, 512, 2048, 132) is not None  # 16 (run 22: 1.10x)
    assert _cfg(2112, 7168, 16).splitk == 0 and _cfg(2112, 7168, 24).splitk > 1


def test_model_fits_run9():
    """The small-M model reproduces the 18 M <= 128 rows of run 9 it was fitted to within 20 % (mean error under 8 %)."""
    run9 = {1: [13.6, 15.6, 9.4, 36.8, 15.6, 9.6], 64: [12.9, 15.1, 9.1, 39.2, 14.9, 8.5],
            128: [14.2, 18.1, 11.1, 48.8, 17.5, 10.5]}
    errs = []
    for m, times in run9.items():
        for (n, k), t in zip(NK, times):
            pred = kernels.small_m_time(m, n, k, 132, *kernels.choose_blocks(m, n, 1, 132))
            errs.append(abs(pred / t - 1))
            assert errs[-1] < 0.2, (m, n, k, pred, t)
    assert sum(errs) / len(errs) < 0.08


def test_source():
    """Split kernels take the workspace and the counters as two extra arguments and SPLITK as gemm_body's last
    template argument; the default kernels' source has neither (and its first line no splitk field)."""
    on, off = _cfg(2112, 7168, 64, env="4", pipe="0"), _cfg(2112, 7168, 64, env="0", pipe="0")
    src, src0 = kernels.kernel_source(on), kernels.kernel_source(off)
    assert "float* ws, int* tile_ctr) {" in src and ", nullptr, ws, tile_ctr);" in src
    assert re.search(r"gemm_body<0, true, 0, 0, 2112, 7168, 64, \d+, \d+, 0, 1, 0, 0, 0, 0, 4>\(", src)
    assert "tile_ctr" not in src0.split("namespace dg {\ntemplate <> struct Wgmma")[-1] and "splitk" not in src0.split("\n")[0]
    assert "'splitk': 4" in src.split("\n")[0]


@pytest.mark.parametrize("kb,s", [(56, 3), (56, 16), (12, 5), (4, 4), (2, 2), (128, 7)])
def test_slice_bounds(kb, s):
    """Slices cover K blocks 0..kb-1 once, in order, none empty, sizes within one; the kernel's formula is the
    same (producer, consumers, and the consumers' scale prefetch of a unit's first run: the first unit's and the next's)."""
    b = kernels.split_k_bounds(kb, s)
    assert b[0][0] == 0 and b[-1][1] == kb and all(b[i][1] == b[i + 1][0] for i in range(s - 1))
    sizes = [hi - lo for lo, hi in b]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    hdr = compiler.read_header()
    assert hdr.count("kb_lo = slice * KB / SPLITK") == 2 and hdr.count("(slice + 1) * KB / SPLITK") == 3
    assert hdr.count("nslice * KB / SPLITK, (nslice + 1) * KB / SPLITK") == 1


# ---- emulation of the kernel's protocol -------------------------------------------------------------
def _fragment_map(bm, bn, ksplit):
    """(rows, cols) of accumulator register i of epilogue thread tid, as [BN / 2, ET] index tensors: thread
    tid = 128 * wrow + 32 * warp + lane holds, for i = 4 j + 2 h + e, row 64 wrow + 16 warp + lane / 4 + 8 h,
    column 8 j + 2 (lane % 4) + e (the WGMMA m64nN FP32 fragment). The workspace slot stores it at i * ET + tid."""
    et = 128 * (1 if ksplit else bm // 64)
    i = torch.arange(bn // 2)[:, None]
    tid = torch.arange(et)[None, :]
    wrow, warp, lane = tid // 128, (tid % 128) // 32, tid % 32
    j, h, e = i // 4, (i // 2) % 2, i % 2
    return (64 * wrow + 16 * warp + lane // 4 + 8 * h).expand(-1, et), (8 * j + 2 * (lane % 4) + e).expand(bn // 2, -1)


def _partial(a, sfa, b, sfb, m0, n0, bm, bn, lo, hi):
    """One unit's FP32 accumulator: the sum over its K blocks of (A_kb B_kb^T) * sfa * sfb, promoted block by block
    in FP32 as the kernel does (rows / columns past M / N read as zeros, as the TMA boxes)."""
    acc = torch.zeros(bm, bn, dtype=torch.float32)
    at, bt = a[m0:m0 + bm].float(), b[n0:n0 + bn].float()
    at = torch.nn.functional.pad(at, (0, 0, 0, bm - at.shape[0]))
    bt = torch.nn.functional.pad(bt, (0, 0, 0, bn - bt.shape[0]))
    sa = torch.nn.functional.pad(sfa[m0:m0 + bm], (0, 0, 0, bm - sfa[m0:m0 + bm].shape[0]))
    cols = torch.clamp(torch.arange(n0, n0 + bn), max=b.shape[0] - 1) // 128
    for kb in range(lo, hi):
        t = at[:, kb * 128:(kb + 1) * 128] @ bt[:, kb * 128:(kb + 1) * 128].t()
        acc += t * sa[:, kb:kb + 1] * sfb[cols, kb][None, :]
    return acc


def emulate(a, sfa, b, sfb, c, bm, bn, s, ksplit, order, ws, ctr, in_arrival_order=False):
    """Runs every (tile, slice) unit of a split-K launch in `order` (a permutation of unit ids u = slice * NB + n
    over the M blocks; a unit's partial write, fence and counter increment are one step, as the kernel's
    barrier + fence make them). Returns D (FP32, + C). in_arrival_order: the last unit sums partials in
    arrival order instead (the nondeterministic variant the kernel avoids; the test shows it differs)."""
    m, n = a.shape[0], b.shape[0]
    nb, tile_f = -(-n // bn), bm * bn
    rows, cols = _fragment_map(bm, bn, ksplit)
    bounds = kernels.split_k_bounds(a.shape[1] // 128, s)
    d = torch.full((m, n), float("nan"))
    arrivals = {}
    for mb, u in order:
        sl, nblk = u // nb, u % nb
        tile = mb * nb + nblk
        acc = _partial(a, sfa, b, sfb, mb * bm, nblk * bn, bm, bn, *bounds[sl])
        base = (tile * s + sl) * tile_f
        ws[base:base + tile_f] = acc[rows, cols].reshape(-1)  # register i of thread tid -> i * ET + tid
        arrivals.setdefault(tile, []).append(sl)
        prev = int(ctr[tile])
        ctr[tile] = prev + 1
        if prev + 1 != s:
            continue
        ctr[tile] = 0  # the last unit resets the counter
        slots = ws[tile * s * tile_f:(tile + 1) * s * tile_f].view(s, tile_f)
        seq = arrivals[tile] if in_arrival_order else range(s)
        tot = None
        for q in seq:
            tot = slots[q].clone() if tot is None else tot + slots[q]
        out = torch.empty(bm, bn)
        out[rows, cols] = tot.view(bn // 2, -1)
        r1, c1 = min(m, mb * bm + bm), min(n, nblk * bn + bn)
        blk = out[:r1 - mb * bm, :c1 - nblk * bn]
        d[mb * bm:r1, nblk * bn:c1] = blk + (c[mb * bm:r1, nblk * bn:c1] if c is not None else 0)
    return d


def _inputs(m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    a, b = dg.per_token_cast_to_fp8(x.bfloat16()), dg.per_block_cast_to_fp8(y.bfloat16())
    return a, b


@pytest.mark.parametrize("m,n,k,bm,bn,s,ksplit", [(64, 264, 1280, 64, 64, 3, 1), (37, 200, 896, 64, 48, 7, 1),
                                                   (128, 136, 768, 128, 128, 4, 0), (100, 96, 512, 64, 32, 4, 1)])
def test_protocol_emulation(m, n, k, bm, bn, s, ksplit):
    """Any arrival order of the units (interleaved across tiles) gives bit-identical D; the counters are back at
    zero; every workspace element of every slot is written before it is read (the workspace starts poisoned);
    D matches the reference (fp32 matmul of the dequantised inputs). Summing in arrival order instead does
    change bits (so the fixed slice order is what makes the result deterministic)."""
    (a, sfa), (b, sfb) = _inputs(m, n, k, seed=m + n + k)
    c = torch.randn(m, n, generator=torch.Generator().manual_seed(7))
    mbs, nb = -(-m // bm), -(-n // bn)
    units = [(mb, u) for mb in range(mbs) for u in range(nb * s)]
    assert len(kernels.split_k_bounds(k // 128, s)) == s
    # the fragment map is a bijection of the tile (each slot element holds one tile element)
    rows, cols = _fragment_map(bm, bn, ksplit)
    assert len(set(zip(rows.reshape(-1).tolist(), cols.reshape(-1).tolist()))) == bm * bn
    results, arrival_sums = [], []
    rng = random.Random(0)
    for trial in range(6):
        order = units[:] if trial == 0 else rng.sample(units, len(units))
        if trial == 1:
            order = units[::-1]
        ws = torch.full((mbs * nb * s * bm * bn,), float("nan"))
        ctr = torch.zeros(mbs * nb, dtype=torch.int32)
        results.append(emulate(a, sfa, b, sfb, c, bm, bn, s, ksplit, order, ws, ctr))
        assert not ws.isnan().any() and int(ctr.abs().sum()) == 0
        ctr2 = ctr.clone()
        arrival_sums.append(emulate(a, sfa, b, sfb, c, bm, bn, s, ksplit, order, ws.clone(), ctr2, in_arrival_order=True))
    for r in results[1:]:
        assert torch.equal(r, results[0])
    assert not results[0].isnan().any()
    r = torch.empty(m, n)
    ref.ref_gemm_nt(a, sfa, b, sfb, r, c)
    assert dg.calc_diff(results[0], r) < 1e-6
    assert any(not torch.equal(x, results[0]) for x in arrival_sums), "arrival order never changed a bit"


# ---- kernels built by the switch: ptxas ---------------------------------------------------------------
def _split_configs():
    cfgs = [_cfg(n, k, m, env=e) for m in (64, 128) for n, k in NK for e in ("auto", "4")]
    cfgs += [_cfg(4096, 7168, 64, env="16", out=torch.float32, ct=torch.float32),  # FP32 out + C
             _cfg(7168, 2048, 128, env="3", ct=torch.bfloat16),  # BF16 C, K blocks 16 = 5 + 5 + 6
             _cfg(1000, 7168, 37, env="auto"),  # unaligned N and M
             _cfg(7168, 2048, 128, env="4", blocks="128x128"),
             _cfg(4096, 7168, 1, env="8", out=torch.float8_e4m3fn),
             # two K blocks in flight (DEEPGEMM_PIPE=1): BM = 128, the K split at BM = 64, odd slices, multicast
             _cfg(7168, 16384, 128, pipe="1"), _cfg(2112, 7168, 64, env="4", pipe="1"),
             _cfg(1000, 7168, 37, env="5", pipe="1"), _cfg(4096, 7168, 128, env="3", pipe="1", mcast="1")]
    cfgs = [c for c in dict.fromkeys(cfgs) if c.splitk]
    assert len(cfgs) >= 12
    return cfgs


@pytest.mark.skipif(compiler.nvcc_path() is None, reason="nvcc not installed")
def test_split_kernels_compile_clean(tmp_path, monkeypatch):
    """Every kernel the switch builds for the small-M DeepSeek-V3 shapes (auto and S = 4), FP32 / FP8 output,
    FP32 / BF16 C, unaligned N, BM = 128: no spills, no stack, no C75xx warning, <= 232 registers."""
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))
    for cfg in _split_configs():
        _, rec = compiler.build("deepgemm_kernel", kernels.kernel_source(cfg), backend="nvcc")
        assert not compiler.spills(rec.ptxas) and "0 bytes spill stores" in rec.ptxas, (cfg, rec.ptxas)
        assert "C75" not in rec.ptxas, (cfg, rec.ptxas)
        assert int(re.search(r"Used (\d+) registers", rec.ptxas).group(1)) <= 232
