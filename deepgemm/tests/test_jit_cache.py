"""JIT compiler and disk cache (CPU): keys, atomic writes, cross-process reuse, real nvcc build."""
import multiprocessing as mp
import os
import time

import pytest

from deepgemm.jit import compiler, kernels


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_compile(source):
    return b"\x7fELF" + source.encode()[:64], "ptxas info    : Used 42 registers"


def test_cache_key_depends_on_everything():
    k = compiler.cache_key("src", "nvcc", "nvcc:13.0")
    assert k == compiler.cache_key("src", "nvcc", "nvcc:13.0")
    assert len({k, compiler.cache_key("src2", "nvcc", "nvcc:13.0"), compiler.cache_key("src", "nvrtc", "nvcc:13.0"),
                compiler.cache_key("src", "nvcc", "nvcc:12.8"), compiler.cache_key("src", "nvcc", "nvcc:13.0", "sm_100a")}) == 5
    # shape constants are template arguments in the source, so they change the key
    c1 = kernels.Config(0, True, 0, 0, 7168, 2048, 128, 128, 6)
    c2 = kernels.Config(0, True, 0, 0, 7168, 4096, 128, 128, 6)
    assert kernels.kernel_source(c1) != kernels.kernel_source(c2)
    assert "gemm_body<0, true, 0, 0, 7168, 2048, 128, 128, 6, 0, 0>" in kernels.kernel_source(c1)


def test_build_caches_on_disk(cache):
    calls = []

    def fn(src):
        calls.append(src)
        return _fake_compile(src)

    blob, rec = compiler.build("k", "source A", {"n": 1}, compile_fn=fn)
    assert rec.backend == "custom" and rec.seconds >= 0 and "42 registers" in rec.ptxas
    blob2, rec2 = compiler.build("k", "source A", {"n": 1}, compile_fn=fn)
    assert blob2 == blob and rec2.backend == "cache" and len(calls) == 1
    assert "42 registers" in rec2.ptxas  # ptxas' report comes back from the cache too
    compiler.build("k", "source B", compile_fn=fn)
    assert len(calls) == 2
    files = sorted(p.name for p in cache.iterdir())
    assert sum(f.endswith(".cubin") for f in files) == 2 and not any(f.endswith(".tmp") for f in files)


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    p = tmp_path / "x.bin"
    compiler.atomic_write(p, b"old")

    with pytest.raises(TypeError):
        compiler.atomic_write(p, object())  # write fails midway
    assert p.read_bytes() == b"old"
    assert [f.name for f in tmp_path.iterdir()] == ["x.bin"]


def _worker(cache_dir, q):
    os.environ["DEEPGEMM_CACHE_DIR"] = cache_dir

    def slow(src):
        time.sleep(0.5)
        return _fake_compile(src)

    blob, rec = compiler.build("k", "shared source", compile_fn=slow)
    q.put((blob, rec.backend))


def test_concurrent_processes_compile_once(cache):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(cache), q)) for _ in range(3)]
    for p in procs:
        p.start()
    res = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert len({r[0] for r in res}) == 1
    assert sorted(r[1] for r in res) == ["cache", "cache", "custom"]  # one compiled, two reused


@pytest.mark.skipif(compiler.nvcc_path() is None, reason="nvcc not installed")
def test_real_nvcc_compile(cache):
    cfg = kernels.Config(2, True, 0, 0, 256, 256, 64, 32, kernels.max_stages(True, 256, 64, 32))
    t0 = time.perf_counter()
    cubin, rec = compiler.build("deepgemm_kernel", kernels.kernel_source(cfg), backend="nvcc")
    assert cubin[:4] == b"\x7fELF" and rec.backend == "nvcc"
    assert "registers" in rec.ptxas and "0 bytes spill stores" in rec.ptxas
    assert time.perf_counter() - t0 < 120
    _, rec2 = compiler.build("deepgemm_kernel", kernels.kernel_source(cfg), backend="nvcc")
    assert rec2.backend == "cache"


@pytest.mark.skipif(compiler.nvcc_path() is None, reason="nvcc not installed")
def test_real_nvcc_compile_variants(cache):
    """The K split (even stages), the swap-AB kernels and the pipelined FP8 kernels compile for sm_90a
    without spills, and ptxas does not serialise the pipelined kernels' WGMMAs (warning C7518)."""
    for cfg in (kernels.Config(2, True, 0, 0, 4096, 7168, 64, 128, 6, 0, 1),
                kernels.Config(0, True, 1, 1, 2112, 7168, 16, 64, 12, 0, 0, 1),
                kernels.Config(2, True, 2, 0, 4096, 512, 8, 64, 4, 0, 0, 1),
                kernels.Config(0, True, 0, 0, 7168, 16384, 16, 64, 12, 0, 0, 2),
                kernels.Config(2, True, 0, 0, 4096, 7168, 8, 64, 12, 0, 0, 2),
                kernels.Config(2, True, 0, 0, 4096, 7168, 64, 128, 9, 0, 0, 0, 1),
                kernels.Config(0, True, 0, 0, 7168, 2048, 128, 128, 6, 1, 0, 0, 1)):
        _, rec = compiler.build("deepgemm_kernel", kernels.kernel_source(cfg), backend="nvcc")
        assert "0 bytes spill stores" in rec.ptxas and "0 bytes spill loads" in rec.ptxas, (cfg, rec.ptxas)
        assert "C75" not in rec.ptxas, (cfg, rec.ptxas)


def test_pipelined_kernel_falls_back_when_it_spills(monkeypatch):
    """DEEPGEMM_PIPE=1 keeps three register tiles live; where ptxas spills, the JIT uses PIPE = 0."""
    assert compiler.spills("8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads")
    assert not compiler.spills("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads | Used 232 registers")
    built = []

    def fake_build(cfg):
        built.append(cfg.pipe)
        spill = (cfg.pipe or cfg.mcast) and cfg.bn == 112
        report = "16 bytes stack frame, 16 bytes spill stores" if spill else "0 bytes stack frame"
        return f"cubin pipe={cfg.pipe} mcast={cfg.mcast}".encode(), compiler.CompileRecord("k", "key", "custom", 0.0,
                                                                                          ptxas=report)

    class FakeKernel:
        def __init__(self, cubin, name, smem):
            self.cubin = cubin

    monkeypatch.setattr(kernels, "_build", fake_build)
    monkeypatch.setattr(kernels.runtime, "Kernel", FakeKernel)
    monkeypatch.setattr(kernels, "_kernels", {})
    spilling = kernels.Config(0, True, 0, 0, 7168, 2048, 64, 112, 10, 0, 0, 0, 1)
    fitting = kernels.Config(0, True, 0, 0, 7168, 2048, 64, 128, 9, 0, 0, 0, 1)
    kern, eff = kernels.get_kernel(spilling)
    assert kern.cubin == b"cubin pipe=0 mcast=0" and eff.pipe == 0 and built == [1, 0]
    kern, eff = kernels.get_kernel(fitting)
    assert kern.cubin == b"cubin pipe=1 mcast=0" and eff == fitting and built == [1, 0, 1]
    # a multicast kernel that spills falls back to the plain one, and launches follow its config
    kern, eff = kernels.get_kernel(kernels.replace(spilling, pipe=0, ksplit=1, mcast=2))
    assert kern.cubin == b"cubin pipe=0 mcast=0" and eff.mcast == 0 and eff.ksplit == 1


def test_small_m_switches(monkeypatch):
    import torch
    monkeypatch.setenv("DEEPGEMM_SFA_ONCE", "0")  # the template arguments checked below end at PIPE / MCAST
    d = torch.empty(1, 1, dtype=torch.bfloat16)
    fill = kernels.make_config("dense", True, d, None, 7168, 2048, 64, 1)
    monkeypatch.setenv("DEEPGEMM_SMALL_M_BN", "pow2")
    pow2 = kernels.make_config("dense", True, d, None, 7168, 2048, 64, 1)
    assert fill.bn == 56 and pow2.bn in kernels.BLOCK_NS_FP8_POW2  # the regression noted in BENCHMARKS.md
    big_fill = kernels._make_config("dense", True, torch.bfloat16, None, 7168, 2048, 4096, 1, 132, "staged", "0", "fill")
    big_pow2 = kernels._make_config("dense", True, torch.bfloat16, None, 7168, 2048, 4096, 1, 132, "staged", "0", "pow2")
    assert big_fill == big_pow2  # M > 128: unchanged
    monkeypatch.setenv("DEEPGEMM_SMALL_M_BN", "wide")
    with pytest.raises(ValueError, match="DEEPGEMM_SMALL_M_BN"):
        kernels.make_config("dense", True, d, None, 7168, 2048, 64, 1)
    monkeypatch.delenv("DEEPGEMM_SMALL_M_BN")
    assert kernels.make_config("dense", True, d, None, 7168, 2048, 1, 1).swap == 0  # off by default
    monkeypatch.setenv("DEEPGEMM_SWAP_AB", "1")
    s1 = kernels.make_config("dense", True, d, None, 7168, 2048, 1, 1)
    s16 = kernels.make_config("masked", True, d, None, 4096, 7168, 16, 32)
    assert (s1.swap, s1.bm, s1.bn, s1.threads) == (1, 8, 64, 256) and (s16.swap, s16.bm) == (1, 16)
    monkeypatch.setenv("DEEPGEMM_SWAP_AB", "2")
    s2 = kernels.make_config("dense", True, d, None, 7168, 2048, 1, 1)
    assert s2.swap == 2 and "gemm_swap_body<0, 0, 0, 7168, 2048, 8, %d, 1>" % s2.stages in kernels.kernel_source(s2)
    monkeypatch.setenv("DEEPGEMM_SWAP_AB", "yes")
    with pytest.raises(ValueError, match="DEEPGEMM_SWAP_AB"):
        kernels.make_config("dense", True, d, None, 7168, 2048, 1, 1)
    monkeypatch.setenv("DEEPGEMM_SWAP_AB", "1")
    assert kernels.smem_bytes(True, 2048, 8, 64, s1.stages, swap=1) <= kernels.SMEM_LIMIT
    assert "gemm_swap_body<0, 0, 0, 7168, 2048, 8," in kernels.kernel_source(s1)
    assert "m64n8k32" in kernels.kernel_source(s1)
    assert kernels.make_config("dense", True, d, None, 7168, 2048, 17, 1).swap == 0  # M > 16
    assert kernels.make_config("contiguous", True, d, None, 7168, 2048, 1, 1).swap == 0
    assert kernels.make_config("dense", False, d, None, 7168, 2048, 1, 1).swap == 0  # BF16
    monkeypatch.setenv("DEEPGEMM_SWAP_AB", "0")
    monkeypatch.setenv("DEEPGEMM_PIPE", "0")
    assert kernels.make_config("dense", True, d, None, 7168, 2048, 64, 1).pipe == 0
    monkeypatch.setenv("DEEPGEMM_PIPE", "1")
    monkeypatch.setenv("DEEPGEMM_KSPLIT", "0")  # the pipelined path is the one without the K split
    p = kernels.make_config("dense", True, d, None, 7168, 2048, 64, 1)
    assert p.pipe == 1 and kernels.kernel_source(p).count(f"{p.stages}, 1, 0, 1>(") == 1
    assert kernels.make_config("dense", False, d, None, 7168, 2048, 64, 1).pipe == 0  # BF16
    monkeypatch.setenv("DEEPGEMM_KSPLIT", "1")  # with the K split too: each warpgroup's blocks in pairs
    p = kernels.make_config("dense", True, d, None, 7168, 2048, 64, 1)
    assert p.ksplit == 1 and p.pipe == 1 and p.stages >= 4
    assert kernels.make_config("dense", True, d, None, 4096, 384, 64, 1).pipe == 0  # 2 stages: too few for pairs
    monkeypatch.setenv("DEEPGEMM_PIPE", "2")
    with pytest.raises(ValueError, match="DEEPGEMM_PIPE"):
        kernels.make_config("dense", True, d, None, 7168, 2048, 64, 1)
    # auto (the default): FP8 dense at 16 < M <= 128 (split-K or the plain kernel without the K split)
    monkeypatch.delenv("DEEPGEMM_PIPE")
    monkeypatch.setenv("DEEPGEMM_KSPLIT", "0")
    assert kernels.PIPE_DEFAULT == "auto"
    assert kernels.make_config("dense", True, d, None, 24576, 1536, 128, 1).pipe == 1
    assert kernels.make_config("dense", True, d, None, 7168, 16384, 128, 1).pipe == 1  # split-K
    for m in (1, 16, 129, 4096):
        assert kernels.make_config("dense", True, d, None, 7168, 2048, m, 1).pipe == 0, m
    assert kernels.make_config("masked", True, d, None, 7168, 2048, 64, 4).pipe == 0


def test_block_choice_and_smem():
    for fp8 in (True, False):
        for k in (512, 2048, 7168, 16384):
            for bm in kernels.BLOCK_MS:
                for bn in (kernels.BLOCK_NS_FP8 if fp8 else kernels.BLOCK_NS_BF16):
                    s = kernels.max_stages(fp8, k, bm, bn)
                    assert s >= 2 and kernels.smem_bytes(fp8, k, bm, bn, s) <= kernels.SMEM_LIMIT
    bm, bn = kernels.choose_blocks(4096, 7168, 1, 132)
    assert bm == 128 and bn >= 112  # large M: big tiles
    bm, bn = kernels.choose_blocks(64, 7168, 1, 132)
    assert bm == 64 and 120 <= -(-7168 // bn) <= 132  # small M: N blocks sized to fill the SMs in one wave
    assert kernels.choose_blocks(64, 2112, 1, 132) == (64, 16)  # 2112 / 16 = 132 tiles


def test_small_m_prefers_128_row_tiles_with_pipe(monkeypatch):
    """64 < M <= 128, FP8 dense (PIPE on): one 128-row tile of half the width instead of two 64-row tiles
    where it is >= 32 wide and fills 3/4 of the SMs (BENCHMARKS.md runs 28-29: 27 shapes 0.95-1.47x, geo 1.17x);
    masked (no PIPE), DEEPGEMM_PIPE=0, M <= 64, the split-K shapes and BF16 keep their tiles."""
    import torch
    for var in ("DEEPGEMM_PIPE", "DEEPGEMM_BLOCKS", "DEEPGEMM_SPLIT_K", "DEEPGEMM_GEMV"):
        monkeypatch.delenv(var, raising=False)
    d = torch.empty(1, 1, dtype=torch.bfloat16)

    def tiles(kind, m, n, k, groups=1, fp8=True):
        cfg = kernels.make_config(kind, fp8, d, None, n, k, m, groups)
        return cfg.bm, cfg.bn, cfg.splitk

    assert tiles("dense", 128, 7168, 2048) == (128, 56, 0)
    assert tiles("dense", 80, 4096, 7168) == (128, 32, 0)
    assert tiles("dense", 128, 4096, 7168) == (64, 64, 0)  # 25 % more bytes per SM: not worth it at 128 rows
    assert tiles("dense", 96, 3072, 2048) == (64, 48, 0)  # not 128 x 24: under 32 wide (run 29: 0.91-1.04x)
    assert tiles("dense", 72, 2048, 2048) == (64, 32, 0)  # nor 128 x 32: 64 tiles, half the SMs
    assert tiles("dense", 128, 7168, 16384)[2] == 2  # split-K as before
    assert tiles("dense", 64, 7168, 2048)[0] == 64
    assert tiles("masked", 128, 7168, 2048) == (64, 112, 0)
    assert tiles("dense", 128, 7168, 2048, fp8=False) == tiles("masked", 128, 7168, 2048, fp8=False)
    monkeypatch.setenv("DEEPGEMM_PIPE", "0")
    assert tiles("dense", 128, 7168, 2048) == (64, 112, 0)


def test_make_config_switches(monkeypatch):
    import torch
    d = torch.empty(1, 1, dtype=torch.bfloat16)
    cfg = kernels.make_config("dense", True, d, None, 7168, 2048, 64, 1)
    assert cfg.bm == 64 and cfg.ksplit == 1 and cfg.epi == 1 and cfg.threads == 384  # K split on by default
    assert cfg.stages % 2 == 0  # even depth under the split
    assert kernels.smem_bytes(True, 2048, cfg.bm, cfg.bn, cfg.stages, cfg.epi, cfg.ksplit) <= kernels.SMEM_LIMIT
    monkeypatch.setenv("DEEPGEMM_KSPLIT", "0")
    monkeypatch.setenv("DEEPGEMM_EPILOGUE", "direct")
    cfg0 = kernels.make_config("dense", True, d, None, 7168, 2048, 64, 1)
    assert cfg0.ksplit == 0 and cfg0.epi == 0 and cfg0.threads == 256
    big = kernels.make_config("dense", True, torch.empty(1, 1), torch.empty(1, 1), 7168, 2048, 4096, 1)
    assert big.bm == 128 and big.ksplit == 0 and big.epi == 0 and big.out == 1 and big.ct == 1  # fp32 out: direct
    assert kernels.make_config("dense", False, d, None, 7168, 2048, 64, 1).ksplit == 0  # BF16: no K split


def test_multicast_switch(monkeypatch):
    """DEEPGEMM_MULTICAST=1 clusters dense BM = 128 tiles in pairs along M sharing B (even M blocks), else
    dense/masked tiles in pairs along N sharing A (even N blocks); the source gets __cluster_dims__ and
    the MCAST template argument; the contiguous layout stays plain."""
    import torch
    monkeypatch.setenv("DEEPGEMM_BN256", "0")  # the 128 x 256 tile has no multicast variant
    monkeypatch.setenv("DEEPGEMM_TMA_STORE", "0")  # nor has the TMA-store epilogue
    monkeypatch.setenv("DEEPGEMM_SFA_ONCE", "0")  # the template arguments checked below end at MCAST
    monkeypatch.setenv("DEEPGEMM_GEMV", "0")  # nor has the small-M kernel (M = 1 below)
    d = torch.empty(1, 1, dtype=torch.bfloat16)
    assert kernels.make_config("dense", True, d, None, 7168, 2048, 4096, 1).mcast == 0  # off by default
    monkeypatch.setenv("DEEPGEMM_MULTICAST", "1")
    cfg = kernels.make_config("dense", True, d, None, 7168, 2048, 4096, 1)
    src = kernels.kernel_source(cfg)
    assert cfg.mcast == 1 and cfg.bm == 128 and "__cluster_dims__(2, 1, 1)" in src
    assert f"{cfg.stages}, {cfg.epi}, 0, 0, 1>(" in src
    assert kernels.make_config("dense", False, d, None, 4096, 7168, 4096, 1).mcast == 1  # BF16 too
    assert kernels.make_config("contiguous", True, d, None, 4096, 7168, 8192, 4).mcast == 0
    # small M (and M blocks that do not pair up): pairs along N share A, where the N blocks pair up
    for kind, n, k, m, g in [("dense", 7168, 2048, 64, 1), ("dense", 4096, 7168, 1, 1), ("masked", 4096, 7168, 32, 32),
                             ("dense", 7168, 2048, 3900, 1)]:
        c = kernels.make_config(kind, True, d, None, n, k, m, g)
        assert c.mcast == (2 if -(-n // c.bn) % 2 == 0 else 0), c
        if c.mcast:
            assert "__cluster_dims__(2, 1, 1)" in kernels.kernel_source(c) and ", 0, 2>(" in kernels.kernel_source(c)
    assert any(kernels.make_config("dense", True, d, None, n, 2048, 64, 1).mcast == 2 for n in (2112, 4096, 7168, 24576))
    monkeypatch.setenv("DEEPGEMM_MULTICAST", "2")
    with pytest.raises(ValueError, match="DEEPGEMM_MULTICAST"):
        kernels.make_config("dense", True, d, None, 7168, 2048, 4096, 1)


def test_blocks_override(monkeypatch):
    """DEEPGEMM_BLOCKS="BMxBN" forces the block sizes (tuning); bad values name the variable."""
    import torch
    d = torch.empty(1, 1, dtype=torch.bfloat16)
    monkeypatch.setenv("DEEPGEMM_BLOCKS", "128x96")
    cfg = kernels.make_config("dense", True, d, None, 7168, 2048, 4096, 1)
    assert (cfg.bm, cfg.bn) == (128, 96)
    assert kernels.smem_bytes(True, 2048, cfg.bm, cfg.bn, cfg.stages, cfg.epi, cfg.ksplit) <= kernels.SMEM_LIMIT
    monkeypatch.setenv("DEEPGEMM_BLOCKS", "64x112")
    cfg = kernels.make_config("masked", True, d, None, 4096, 7168, 64, 8)
    assert (cfg.bm, cfg.bn, cfg.ksplit) == (64, 112, 1) and cfg.stages % 2 == 0
    assert (kernels.make_config("dense", False, d, None, 4096, 7168, 4096, 1).bn) == 112  # BF16 accepts it too
    for bad in ("128", "96x128", "128x130", "64x256", "axb"):
        monkeypatch.setenv("DEEPGEMM_BLOCKS", bad)
        with pytest.raises(ValueError, match="DEEPGEMM_BLOCKS"):
            kernels.make_config("dense", True, d, None, 7168, 2048, 4096, 1)


def test_stages_override(monkeypatch):
    """DEEPGEMM_STAGES=<S> sets the tiled kernels' ring depth (tuning): deeper than the default cap of 12 where it
    fits, even under the K split, PIPE dropped below its minimum; bad values name the variable and the limit."""
    import torch
    d = torch.empty(1, 1, dtype=torch.bfloat16)
    default = kernels.make_config("dense", True, d, None, 4096, 7168, 64, 1)
    assert default.stages == 12 and default.ksplit and default.pipe
    for s in ("16", "8", "4"):
        monkeypatch.setenv("DEEPGEMM_STAGES", s)
        cfg = kernels.make_config("dense", True, d, None, 4096, 7168, 64, 1)
        assert (cfg.bm, cfg.bn, cfg.stages, cfg.pipe) == (default.bm, default.bn, int(s), 1)
        assert kernels.smem_bytes(True, 7168, cfg.bm, cfg.bn, cfg.stages, cfg.epi, cfg.ksplit) <= kernels.SMEM_LIMIT
    monkeypatch.setenv("DEEPGEMM_STAGES", "1")  # no K split at BM = 128: one stage, no PIPE
    cfg = kernels.make_config("dense", True, d, None, 7168, 2048, 4096, 1)
    assert cfg.stages == 1 and not cfg.pipe
    monkeypatch.setenv("DEEPGEMM_STAGES", "3")
    cfg = kernels.make_config("dense", True, d, None, 7168, 16384, 128, 1)  # split-K, 128-row tiles
    assert cfg.splitk and cfg.stages == 3
    for bad in ("18", "7", "0", "x", "-2"):  # 18: more than fits; 7: odd under the K split
        monkeypatch.setenv("DEEPGEMM_STAGES", bad)
        with pytest.raises(ValueError, match="DEEPGEMM_STAGES"):
            kernels.make_config("dense", True, d, None, 4096, 7168, 64, 1)
