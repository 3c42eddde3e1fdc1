"""The large-M switches on the CPU: DEEPGEMM_BN256 (FP8 128 x 256 tiles) and DEEPGEMM_TMA_STORE (epilogue
through TMA stores): block choice, shared-memory plan, interplay with the other switches, generated source,
and (with nvcc) ptxas' report and the SASS of the kernels they build."""
import os
import re
import subprocess

import pytest
import torch

from deepgemm.jit import compiler, kernels

NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
D = torch.empty(1, 1, dtype=torch.bfloat16)


def test_bn256_block_choice(monkeypatch):
    """Off: the model's choice is unchanged (never 192 or 256). On: 128 x 256 at every large DeepSeek-V3 shape
    but N = 2112, where 128 x 128 stays (128 x 192's 3 waves against its 5 measured 0.94-0.95x, run 31); never at
    M <= 128."""
    for n, _ in NK:
        assert kernels.choose_blocks(4096, n, 1, 132)[1] <= 128
    picks = {n: kernels.choose_blocks(4096, n, 1, 132, bn256=True) for n, _ in NK}
    assert picks == {2112: (128, 128), 24576: (128, 256), 32768: (128, 256), 7168: (128, 256), 4096: (128, 256)}
    for m in (1, 64, 128):
        for n, _ in NK:
            assert kernels.choose_blocks(m, n, 1, 132, bn256=True) == kernels.choose_blocks(m, n, 1, 132)
    assert kernels.choose_blocks(4096, 7168, 1, 132, fp8=False, bn256=True)[1] <= 256  # BF16: its own list


def test_measured_defaults(monkeypatch):
    """The defaults the H200 A/B picked (BENCHMARKS.md, 2026-11-29, run 23): 128 x 256 tiles at large M, TMA stores
    for dense and grouped-contiguous BF16 outputs at K <= 2048 only (deeper K keeps the two extra pipeline stages
    instead), not for masked ones."""
    for var in ("DEEPGEMM_BN256", "DEEPGEMM_TMA_STORE", "DEEPGEMM_BLOCKS", "DEEPGEMM_EPILOGUE"):
        monkeypatch.delenv(var, raising=False)
    picks = {(n, k): kernels.make_config("dense", True, D, None, n, k, 4096, 1) for n, k in NK}
    assert {nk: (c.bn, c.tstore) for nk, c in picks.items()} == {
        (2112, 7168): (picks[2112, 7168].bn, 0), (24576, 1536): (256, 1), (32768, 512): (256, 1),
        (7168, 16384): (256, 0), (4096, 7168): (256, 0), (7168, 2048): (256, 1)}
    assert picks[2112, 7168].bn < 256 and all(c.rs == 0 for c in picks.values())
    assert kernels.make_config("contiguous", True, D, None, 7168, 2048, 32768, 1).tstore == 1
    assert kernels.make_config("contiguous", True, D, None, 4096, 7168, 32768, 1).tstore == 0
    assert kernels.make_config("masked", True, D, None, 7168, 2048, 256, 32).tstore == 0  # masked: only forced
    assert kernels.make_config("dense", True, D, None, 7168, 2048, 64, 1).bn < 256  # small M: unchanged
    monkeypatch.setenv("DEEPGEMM_TMA_STORE", "1")
    assert kernels.make_config("dense", True, D, None, 4096, 7168, 4096, 1).tstore == 1
    monkeypatch.setenv("DEEPGEMM_TMA_STORE", "0")
    assert kernels.make_config("dense", True, D, None, 7168, 2048, 4096, 1).tstore == 0


def test_bn192_config(monkeypatch):
    """FP8 128 x 192 tiles come with the wide ones (DEEPGEMM_BN256 != 0) at M > 128, run the plain main loop
    (m64n192k32 WGMMAs) and stage their BF16 epilogue in 64-column passes; only BM = 128 takes them."""
    for var in ("DEEPGEMM_BN256", "DEEPGEMM_TMA_STORE", "DEEPGEMM_BLOCKS", "DEEPGEMM_EPILOGUE"):
        monkeypatch.delenv(var, raising=False)
    cfg = kernels.make_config("dense", True, D, None, 3072, 7168, 1024, 1)
    assert (cfg.bm, cfg.bn, cfg.rs, cfg.epi) == (128, 192, 0, 1)
    src = kernels.kernel_source(cfg)
    assert "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3" in src and "Wgmma<192, true>" in src
    assert kernels.smem_bytes(True, 7168, 128, 192, cfg.stages, 1) <= kernels.SMEM_LIMIT
    # it replaces 128 x 96 in as many waves (run 31: 1.08-1.11x), not 128 x 128 in fewer (N = 2112: 0.94x)
    assert kernels.choose_blocks(1024, 3072, 1, 132) == (128, 96)
    assert kernels.choose_blocks(1024, 3072, 1, 132, bn256=True) == (128, 192)
    assert kernels.choose_blocks(256, 12288, 1, 132, bn256=True) == (128, 192)
    assert kernels.choose_blocks(4096, 2112, 1, 132, bn256=True) == (128, 128)
    assert kernels.make_config("dense", True, D, None, 2112, 7168, 128, 1).bn <= 128  # small M: unchanged
    assert kernels.parse_blocks("128x192", True) == (128, 192)
    with pytest.raises(ValueError, match="DEEPGEMM_BLOCKS"):
        kernels.parse_blocks("64x192", True)
    monkeypatch.setenv("DEEPGEMM_BN256", "0")
    assert kernels.make_config("dense", True, D, None, 3072, 7168, 1024, 1).bn == 96


def test_bn256_config_and_smem(monkeypatch):
    monkeypatch.setenv("DEEPGEMM_BN256", "1")
    monkeypatch.setenv("DEEPGEMM_TMA_STORE", "0")
    monkeypatch.setenv("DEEPGEMM_PIPE", "1")       # ignored by the wide tile
    monkeypatch.setenv("DEEPGEMM_MULTICAST", "1")  # ignored by the wide tile
    for n, k in NK[1:]:
        cfg = kernels.make_config("dense", True, D, None, n, k, 4096, 1)
        assert (cfg.bm, cfg.bn, cfg.pipe, cfg.mcast, cfg.ksplit, cfg.epi) == (128, 256, 0, 0, 0, 1), cfg
        assert cfg.threads == 384 and cfg.stages == min(4, k // 128)
        # staged epilogue in 64-column passes: 2 x 64 x 144 bytes beside four 49.7 KB stages
        assert kernels.smem_bytes(True, k, 128, 256, cfg.stages, 1) == 1024 + cfg.stages * 49664 + 16 * cfg.stages + 18432
        assert kernels.smem_bytes(True, k, 128, 256, cfg.stages, 1) <= kernels.SMEM_LIMIT
        src = kernels.kernel_source(cfg)
        assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in src and "Wgmma<128, true>" in src
    assert kernels.make_config("contiguous", True, D, None, 4096, 7168, 32768, 1).bn == 256
    assert kernels.make_config("masked", True, D, None, 4096, 7168, 256, 4).bn == 256
    assert kernels.make_config("dense", True, D, None, 7168, 2048, 128, 1).bn <= 128  # small M: unchanged
    monkeypatch.setenv("DEEPGEMM_BN256", "0")
    assert kernels.make_config("dense", True, D, None, 7168, 2048, 4096, 1).bn == 128
    monkeypatch.setenv("DEEPGEMM_BN256", "2")  # A from registers: same tiles, RS WGMMAs
    rs = kernels.make_config("dense", True, D, None, 7168, 2048, 4096, 1)
    assert (rs.bn, rs.rs, rs.stages) == (256, 1, 4)
    src = kernels.kernel_source(rs)
    assert "struct WgmmaRS<128>" in src and "{%64, %65, %66, %67}, %68" in src and ", 0, 0, 0, 1>(" in src
    assert kernels.make_config("dense", True, D, None, 7168, 2048, 128, 1).rs == 0  # no wide tile: no RS
    monkeypatch.setenv("DEEPGEMM_BN256", "yes")
    with pytest.raises(ValueError, match="DEEPGEMM_BN256"):
        kernels.make_config("dense", True, D, None, 7168, 2048, 4096, 1)


def test_bn256_forced_blocks(monkeypatch):
    """DEEPGEMM_BLOCKS=128x256 forces the wide tile (FP8); 64 x 256 stays invalid for FP8."""
    monkeypatch.setenv("DEEPGEMM_BLOCKS", "128x256")
    cfg = kernels.make_config("dense", True, D, None, 2112, 7168, 1000, 1)
    assert (cfg.bm, cfg.bn, cfg.stages) == (128, 256, 4)
    monkeypatch.setenv("DEEPGEMM_BLOCKS", "64x256")
    with pytest.raises(ValueError, match="DEEPGEMM_BLOCKS"):
        kernels.make_config("dense", True, D, None, 2112, 7168, 1000, 1)


def _bn256_configs(mode):
    mk = kernels._make_config
    cfgs = [mk("dense", True, torch.bfloat16, None, n, k, 4096, 1, 132, "staged", "1",
               blocks_env="128x256" if n == 2112 else "", bn256_env=mode) for n, k in NK]
    cfgs += [mk("contiguous", True, torch.bfloat16, None, 4096, 7168, 32768, 1, 132, "staged", "1", bn256_env=mode),
             mk("masked", True, torch.bfloat16, None, 4096, 7168, 256, 4, 132, "staged", "1", bn256_env=mode),
             mk("dense", True, torch.float32, torch.float32, 7168, 2048, 4096, 1, 132, "staged", "1", bn256_env=mode),
             mk("dense", True, torch.bfloat16, torch.bfloat16, 2112, 7168, 1000, 1, 132, "staged", "1",
                blocks_env="128x256", bn256_env=mode),
             mk("dense", True, torch.bfloat16, None, 7168, 2048, 4096, 1, 132, "direct", "1", bn256_env=mode)]
    assert all(c.bn == 256 and c.rs == (mode == "2") for c in cfgs)
    return cfgs


@pytest.mark.skipif(compiler.nvcc_path() is None, reason="nvcc not installed")
@pytest.mark.parametrize("mode", ["1", "2"])
def test_bn256_kernels_compile_clean(mode, tmp_path, monkeypatch):
    """Every kernel the switch builds (2: A from registers) for the DeepSeek-V3 shapes at M = 4096 (N = 2112
    forced), grouped contiguous and masked, FP32 output with C, BF16 C, the direct epilogue: no spills, no
    stack, WGMMAs not serialised (ptxas C75xx), and at most the 232 registers the consumer warpgroups get."""
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))
    for cfg in _bn256_configs(mode):
        _, rec = compiler.build("deepgemm_kernel", kernels.kernel_source(cfg), backend="nvcc")
        assert not compiler.spills(rec.ptxas) and "0 bytes spill stores" in rec.ptxas, (cfg, rec.ptxas)
        assert "C75" not in rec.ptxas, (cfg, rec.ptxas)
        assert int(re.search(r"Used (\d+) registers", rec.ptxas).group(1)) <= 232


def test_tma_store_config(monkeypatch):
    """On: GEMMs with BF16 output, the staged epilogue and BN % 64 == 0 (both tile shapes); the grouped layouts
    only where M (contiguous) or expected_m (masked, forced only) is at least BM (the kernel stores boxes with rows that must
    stay untouched directly); never FP32 / FP8 output, the direct epilogue, BN = 112; no multicast with it. The
    kernel gets the output's tensor map as an extra parameter."""
    monkeypatch.setenv("DEEPGEMM_TMA_STORE", "1")
    monkeypatch.setenv("DEEPGEMM_MULTICAST", "1")
    monkeypatch.setenv("DEEPGEMM_BN256", "0")
    cfg = kernels.make_config("dense", True, D, None, 7168, 2048, 4096, 1)
    assert (cfg.bn, cfg.tstore, cfg.mcast, cfg.stages) == (128, 1, 0, 5)
    assert kernels.smem_bytes(True, 2048, 128, 128, 5, 1, tstore=1) == 1024 + 5 * 33280 + 80 + 4 * 8192
    src = kernels.kernel_source(cfg)
    assert "const __grid_constant__ dg::TmaDesc tma_d)" in src and ", &tma_d);" in src and ", 0, 0, 1>(" in src
    monkeypatch.setenv("DEEPGEMM_BN256", "1")
    wide = kernels.make_config("dense", True, D, None, 7168, 2048, 4096, 1)
    assert (wide.bn, wide.tstore, wide.stages) == (256, 1, 3)  # 64 KB of boxes leave room for 3 stages
    assert kernels.smem_bytes(True, 2048, 128, 256, 3, 1, tstore=1) <= kernels.SMEM_LIMIT
    assert kernels.make_config("contiguous", True, D, None, 4096, 7168, 32768, 1).tstore == 1
    grouped = kernels.make_config("masked", True, D, None, 4096, 7168, 256, 4)
    assert grouped.tstore == 1 and "const __grid_constant__ dg::TmaDesc tma_d)" in kernels.kernel_source(grouped)
    small = kernels.make_config("masked", True, D, None, 4096, 7168, 32, 4)
    assert small.bm > 32 and small.tstore == 0  # expected_m below BM: most boxes would be partial
    assert kernels.make_config("dense", True, torch.empty(1, 1), None, 7168, 2048, 4096, 1).tstore == 0
    monkeypatch.setenv("DEEPGEMM_BLOCKS", "128x112")
    assert kernels.make_config("dense", True, D, None, 2112, 7168, 4096, 1).tstore == 0  # BN = 112
    monkeypatch.delenv("DEEPGEMM_BLOCKS")
    monkeypatch.setenv("DEEPGEMM_EPILOGUE", "direct")
    assert kernels.make_config("dense", True, D, None, 7168, 2048, 4096, 1).tstore == 0
    monkeypatch.setenv("DEEPGEMM_TMA_STORE", "0")
    monkeypatch.delenv("DEEPGEMM_EPILOGUE")
    off = kernels.make_config("dense", True, D, None, 7168, 2048, 4096, 1)
    assert off.tstore == 0 and "dg::TmaDesc tma_d" not in kernels.kernel_source(off)
    monkeypatch.setenv("DEEPGEMM_TMA_STORE", "2")
    with pytest.raises(ValueError, match="DEEPGEMM_TMA_STORE"):
        kernels.make_config("dense", True, D, None, 7168, 2048, 4096, 1)


def _tstore_configs():
    mk = kernels._make_config
    cfgs = [mk("dense", True, torch.bfloat16, None, n, k, 4096, 1, 132, "staged", "1", bn256_env=w, tstore_env="1")
            for n, k in NK[1:] for w in ("0", "1")]
    cfgs += [mk("dense", True, torch.bfloat16, torch.float32, 4104, 1536, 1000, 1, 132, "staged", "1",
                blocks_env="128x64", tstore_env="1"),
             mk("dense", True, torch.bfloat16, torch.bfloat16, 7168, 2048, 64, 1, 132, "staged", "1",
                blocks_env="64x128", tstore_env="1"),  # K split: warpgroup 0 stores
             mk("dense", False, torch.bfloat16, None, 4096, 7168, 4096, 1, 132, "staged", "1",
                blocks_env="128x256", tstore_env="1")]  # BF16 GEMM, four boxes per warpgroup
    assert all(c.tstore for c in cfgs) and cfgs[-2].ksplit == 1
    return cfgs


@pytest.mark.skipif(compiler.nvcc_path() is None, reason="nvcc not installed")
def test_tma_store_kernels_compile_clean(tmp_path, monkeypatch):
    """The TMA-store kernels (128 x 128 and 128 x 256 at M = 4096, a 64-wide tile with C, the K split, a BF16
    GEMM): no spills or stack, no C75xx; where cuobjdump is at hand, the SASS stores through UTMASTG (one
    per 64-column box) and has no 16-byte global store left (the copy-out loop is gone)."""
    from test_multicast import _sass_tools
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path))
    tools = _sass_tools()
    for cfg in _tstore_configs():
        cubin, rec = compiler.build("deepgemm_kernel", kernels.kernel_source(cfg), backend="nvcc")
        assert not compiler.spills(rec.ptxas) and "0 bytes spill stores" in rec.ptxas, (cfg, rec.ptxas)
        assert "C75" not in rec.ptxas, (cfg, rec.ptxas)
        if tools is None:
            continue
        path = tmp_path / "k.cubin"
        path.write_bytes(cubin)
        env = dict(os.environ, PATH=tools + os.pathsep + os.environ.get("PATH", ""))
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", str(path)], capture_output=True, text=True,
                              timeout=60, check=True, env=env).stdout
        assert sass.count("UTMASTG.2D") == cfg.bn // 64, (cfg, sass.count("UTMASTG.2D"))
        assert "STG.E.128" not in sass, cfg


def test_tma_store_box_layout():
    """The TMA-store epilogue's shared-memory writes (sm90_gemm.cuh, TSTORE): thread (warp w, lane l) puts the
    BF16 pair of accumulator columns 8j + 2(l % 4), +1 of row 16w + l / 4 + 8h at r * 128 + (j ^ l / 4) * 16 +
    (l % 4) * 4 of a 64 x 64 box. Replayed here: every byte of the box is written once, each 32-lane store
    hits 32 distinct banks, and reading the box back with the 128-byte TMA swizzle (16-byte chunk c of row r
    at (c ^ r % 8) * 16: CU_TENSOR_MAP_SWIZZLE_128B on a 1024-aligned box) gives the accumulator tile."""
    tile = torch.arange(64 * 64, dtype=torch.int64).reshape(64, 64)  # stand-in values, one per element
    box = torch.full((64 * 128,), -1, dtype=torch.int64)  # one slot per byte
    for w in range(4):
        for h in range(2):
            for j in range(8):
                banks = set()
                for lane in range(32):
                    r, c = 16 * w + lane // 4 + 8 * h, 8 * j + 2 * (lane % 4)
                    assert r % 8 == lane // 4
                    addr = r * 128 + ((j ^ (lane // 4)) * 16) + (lane % 4) * 4
                    banks.add((addr // 4) % 32)
                    for e in range(2):  # the two BF16 values of the 4-byte store
                        for b in range(2):
                            assert box[addr + 2 * e + b] == -1, "byte written twice"
                            box[addr + 2 * e + b] = tile[r, c + e] * 2 + b
                assert len(banks) == 32, (w, h, j, sorted(banks))
    assert (box >= 0).all()
    for r in range(64):
        for c in range(64):
            byte = c * 2
            addr = r * 128 + (((byte // 16) ^ (r % 8)) * 16) + byte % 16
            assert box[addr] == tile[r, c] * 2 and box[addr + 1] == tile[r, c] * 2 + 1


@pytest.mark.parametrize("bn256", ["0", "1"])
def test_min_sms_grid_keeps_waves(bn256):
    """DEEPGEMM_MIN_SMS=1 launches ceil(tiles / waves) CTAs: every tile still computed once, per-CTA counts
    within one of each other, and no CTA gets more tiles (waves) than with one CTA per SM."""
    from test_multicast import SHAPES, schedule
    from deepgemm.utils import ceil_div
    fewer = 0
    for kind, m, n, k, g in SHAPES:
        for num_sms in (132, 78):
            cfg = kernels._make_config(kind, True, torch.bfloat16, None, n, k, m, g, num_sms, "staged", "1",
                                       bn256_env=bn256, min_sms_env="1", gemv_env="0")
            base = kernels._make_config(kind, True, torch.bfloat16, None, n, k, m, g, num_sms, "staged", "1",
                                        bn256_env=bn256, gemv_env="0")
            assert cfg.min_sms == 1 and kernels.kernel_source(cfg) == kernels.kernel_source(base)
            nb = ceil_div(n, cfg.bn)
            tiles = g * ceil_div(m, cfg.bm) * nb
            grid, grid0 = kernels.launch_grid(cfg, tiles, num_sms), kernels.launch_grid(base, tiles, num_sms)
            assert 1 <= grid <= grid0
            fewer += grid < grid0
            seqs = schedule(kind, m, nb, cfg.bm, 0, grid, [m] * g if kind == "masked" else None)
            done = [t for s in seqs for t in s]
            assert len(done) == len(set(done)) == tiles
            assert max(map(len, seqs)) == ceil_div(tiles, grid0) and max(map(len, seqs)) - min(map(len, seqs)) <= 1
    assert fewer > 0
    with pytest.raises(ValueError, match="DEEPGEMM_MIN_SMS"):
        kernels._make_config("dense", True, torch.bfloat16, None, 7168, 2048, 4096, 1, 132, "staged", "1",
                             min_sms_env="2")


def test_rs_ldmatrix_addresses_match_wgmma_fragment():
    """DEEPGEMM_BN256=2 loads A with ldmatrix.x4 from the 128-byte-swizzled stage (sm90_gemm.cuh, WIDE + RS):
    lane L points at row 16w + ((L >> 3) & 1) * 8 + L % 8 of its warpgroup's 64, 16-byte chunk 2kk + (L >> 4)
    (swizzled with L % 8). Replayed with ldmatrix's semantics (lane l gets, in register i, bytes 4(l % 4)..+3
    of the row that lane 8i + l / 4 addressed), every register must hold the bytes that WGMMA's A fragment for
    8-bit types puts there (CUTLASS ALayout_64x32: row 16w + l / 4 + 8(i % 2), K 4(l % 4) + 16(i / 2) + 0..3)."""
    tile = [[(r * 131 + kb * 7) % 251 for kb in range(128)] for r in range(128)]  # stage A: 128 rows x 128 B
    smem = [0] * (128 * 128)
    for r in range(128):  # TMA's 128-byte swizzle on a 1024-aligned stage
        for kb in range(128):
            smem[r * 128 + (((kb // 16) ^ (r % 8)) * 16) + kb % 16] = tile[r][kb]
    for wrow in range(2):
        a_addr = wrow * 64 * 128
        for w in range(4):
            for kk in range(4):
                def lane_addr(L):
                    lrow = w * 16 + ((L >> 3) & 1) * 8 + (L & 7)
                    return a_addr + lrow * 128 + ((((2 * kk) + (L >> 4)) ^ (L & 7)) << 4)
                for lane in range(32):
                    for i in range(4):
                        base = lane_addr(8 * i + lane // 4) + (lane % 4) * 4
                        got = smem[base:base + 4]
                        row = wrow * 64 + 16 * w + lane // 4 + 8 * (i % 2)
                        k0 = 32 * kk + 4 * (lane % 4) + 16 * (i // 2)
                        assert got == tile[row][k0:k0 + 4], (wrow, w, kk, lane, i)


def test_straddling_widths_cost_more_at_large_m():
    """Widths that cross B's 128-column scale blocks pay STRADDLE_COST at M > 128 only: the H200 tune run's
    128 x 128 at M = 4096 N = 2112 (1.11x the 128 x 112 the model picked before), and the small-M picks stay."""
    assert [bn for bn in (16, 32, 56, 64, 96, 112, 128, 256) if kernels.straddles(bn)] == [56, 96, 112]
    assert kernels.tile_cost(128, 112, True) == 128 * 112 * kernels.STRADDLE_COST
    assert kernels.tile_cost(128, 112) == (128 + 112) * 64  # load-bound without the penalty
    assert kernels.tile_cost(128, 128, True) == kernels.tile_cost(128, 128)
    assert kernels.choose_blocks(4096, 2112, 1, 132, bn256=True) == (128, 128)
    assert kernels.choose_blocks(256, 7168, 1, 132, bn256=True) == (128, 128)  # masked 1 x 256 (was 128 x 112)
    assert kernels.choose_blocks(128, 7168, 1, 132) == (64, 112)  # M <= 128: unchanged


def test_ties_prefer_the_wider_tile():
    """Same cost and tile count: 64 x 128 (K split over two warpgroups) over 128 x 64, e.g. one masked group of
    256 rows at N = 4096 (128 tiles either way)."""
    assert kernels.choose_blocks(256, 4096, 1, 132, bn256=True) == (64, 128)
    assert kernels.tile_cost(64, 128) == kernels.tile_cost(128, 64)


def test_peel_rows():
    """The last M block runs as a GEMM of its own where that saves a wave of the persistent grid and the model's
    small-M time for it (plus the gap) is shorter than the wave: 4096 x 2112 x 7168 (544 tiles of 128 x 128 in 5
    waves; 527 in 4 and 17 in the small-M kernel), not the table's other M = 4096 rows, never at M <= 256."""
    peel = kernels.peel_rows
    assert peel(4096, 2112, 7168, 132, 128, 128) == 3968
    assert peel(4000, 2112, 7168, 132, 128, 128) == 3968
    for n, k in [(24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]:
        assert peel(4096, n, k, 132, 128, 256) == 0, (n, k)
    assert peel(3072, 7168, 16384, 132, 128, 256) == 2944  # 672 tiles: 5 waves and 28 tiles
    assert peel(4096, 24576, 1536, 132, 128, 256) == 0  # saves a wave, but one wave is shorter than the tail GEMM
    assert peel(4096, 24576, 1536, 132, 128, 256, "1") == 3968
    assert peel(4096, 2112, 7168, 132, 128, 128, "0") == 0
    assert peel(4096, 2112, 7168, 136, 128, 128, "1") == 0  # 544 tiles fill 4 waves of 136 SMs: nothing to save
    assert peel(256, 24576, 1536, 132, 128, 128, "1") == 0
    with pytest.raises(ValueError, match="DEEPGEMM_PEEL"):
        peel(4096, 2112, 7168, 132, 128, 128, "yes")
