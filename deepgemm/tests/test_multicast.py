"""TMA multicast (DEEPGEMM_MULTICAST=1), CPU only: the persistent tile schedule with 2-CTA clusters, and
the SASS of the multicast kernels (no GPU-scope memory barrier inside the K loop)."""
import glob
import os
import random
import re
import shutil
import subprocess

import pytest
import torch

from deepgemm.jit import compiler, kernels
from deepgemm.utils import ceil_div

BAND = 16  # kBand of Scheduler::next


def schedule(kind: str, m: int, nb: int, bm: int, mc: int, grid: int, masked_m=None) -> list[list[tuple]]:
    """Plain-Python copy of Scheduler<KIND, BM, NB, MC> (sm90_gemm.cuh): the (g, m_blk, n_blk) tiles that
    CTA b = 0 .. grid - 1 computes, in order. masked: m is the rows per group, masked_m the valid rows."""
    nu = nb // 2 if mc == 2 else nb
    out = []
    for b in range(grid):
        rank, clusters = b & 1, grid >> 1
        t, step = ((b >> 1) - clusters, clusters) if mc else (b - grid, grid)
        cur_g = g_base = 0
        seq = []
        while True:
            t += step
            if kind == "masked":
                tile = None
                while cur_g < len(masked_m):
                    mb = ceil_div(min(max(masked_m[cur_g], 0), m), bm)
                    if t < g_base + mb * nu:
                        loc = t - g_base
                        n_blk = loc // mb
                        tile = (cur_g, loc - n_blk * mb, 2 * n_blk + rank if mc == 2 else n_blk)
                        break
                    g_base += mb * nu
                    cur_g += 1
                if tile is None:
                    break
                seq.append(tile)
                continue
            num_mb = ceil_div(m, bm) // 2 if mc == 1 else ceil_div(m, bm)
            if t >= num_mb * nu:
                break
            band = t // (num_mb * BAND)
            rem = t - band * num_mb * BAND
            n0 = band * BAND
            bw = min(nu - n0, BAND)
            m_blk, n_blk = rem // bw, n0 + rem % bw
            seq.append((0, 2 * m_blk + rank if mc == 1 else m_blk, 2 * n_blk + rank if mc == 2 else n_blk))
        out.append(seq)
    return out


# the shapes of the multicast benchmark (bench_gemm.py --compare DEEPGEMM_MULTICAST=0,1) and a few more
SHAPES = [("dense", m, n, k, 1) for m in (1, 64, 128, 4096) for n, k in
          [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]]
SHAPES += [("masked", 64, 4096, 7168, 8), ("masked", 32, 7168, 2048, 32), ("masked", 256, 4096, 7168, 1),
           ("dense", 3900, 7168, 2048, 1), ("dense", 256, 4096, 7168, 1)]


@pytest.mark.parametrize("num_sms", [132, 78])
def test_cluster_schedule_covers_every_tile_once_and_balances(num_sms):
    """With and without multicast, every tile is computed exactly once, the per-CTA tile counts differ by
    at most one, and the two CTAs of a cluster walk equally long sequences whose tiles share the
    multicast operand at every step (same N block for mcast 1, same group and M block for mcast 2; with split-K
    also the same K slice: units are slice-major, u = slice * NB + n)."""
    rng = random.Random(0)
    seen_mcast, seen_split = set(), False
    for kind, m, n, k, g in SHAPES:
        for env in ("0", "1"):
            cfg = kernels._make_config(kind, True, torch.bfloat16, None, n, k, m, g, num_sms, "staged", "1",
                                       "fill", "0", "0", env)
            nb1 = ceil_div(n, cfg.bn)
            nb = nb1 * max(cfg.splitk, 1)  # the scheduler's N units (split-K: one per N block and slice)
            masked_m = [rng.randint(0, m) for _ in range(g - 1)] + [m] if kind == "masked" else None
            tiles = g * ceil_div(m, cfg.bm) * nb  # what the host passes to the launch
            grid = kernels.launch_grid(cfg, tiles, num_sms)
            assert 1 <= grid <= num_sms and (not cfg.mcast or grid % 2 == 0), (cfg, grid)
            seqs = schedule(kind, m, nb, cfg.bm, cfg.mcast, grid, masked_m)
            done = [tile for seq in seqs for tile in seq]
            valid = masked_m or [m]
            want = {(gi, mb, nbk) for gi in range(len(valid)) for mb in range(ceil_div(min(valid[gi], m), cfg.bm))
                    for nbk in range(nb)}
            assert len(done) == len(set(done)) and set(done) == want, (cfg, grid)
            counts = [len(s) for s in seqs]
            assert max(counts) - min(counts) <= 1, (cfg, grid, counts)
            if cfg.mcast:
                seen_mcast.add(cfg.mcast)
                for c0, c1 in zip(seqs[0::2], seqs[1::2]):
                    assert len(c0) == len(c1), cfg  # else one producer waits forever for the peer's releases
                    for (g0, m0, n0), (g1, m1, n1) in zip(c0, c1):
                        if cfg.mcast == 1:
                            assert (g0, n0, m0 % 2, m1) == (g1, n1, 0, m0 + 1), cfg
                        else:
                            assert (g0, m0, n0 % 2, n1, n0 // nb1) == (g1, m1, 0, n0 + 1, n1 // nb1), cfg
                seen_split |= cfg.splitk > 1 and cfg.mcast == 2
    assert seen_mcast == {1, 2} and seen_split


def _sass_tools():
    """Folder holding cuobjdump and the nvdisasm it runs: PATH, the CUDA toolkit of nvcc, or the
    nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels (requirements-test.txt); None if absent."""
    dirs = [os.path.dirname(p) for p in (shutil.which("cuobjdump"),) if p]
    nvcc = compiler.nvcc_path()
    if nvcc:
        dirs.append(os.path.dirname(os.path.realpath(nvcc)))
    try:
        import nvidia
        dirs += [b for d in nvidia.__path__ for b in sorted(glob.glob(os.path.join(d, "cu*", "bin")))]
    except ImportError:
        pass
    for d in dirs:
        if os.access(os.path.join(d, "cuobjdump"), os.X_OK) and (
                os.access(os.path.join(d, "nvdisasm"), os.X_OK) or shutil.which("nvdisasm")):
            return d
    return None


@pytest.mark.skipif(compiler.nvcc_path() is None or _sass_tools() is None,
                    reason="nvcc, cuobjdump or nvdisasm not installed")
def test_multicast_release_has_no_gpu_membar(tmp_path, monkeypatch):
    """Each consumer warp frees a stage in both CTAs of the cluster once per K block. The remote mbarrier
    arrive must not carry cluster-scope release semantics: ptxas implements that with MEMBAR.ALL.GPU, a
    wait for all of the warp's outstanding global loads and stores, once per K block (H200: the multicast
    kernels ran at half speed). The only GPU-scope barriers left are the one-time cluster syncs."""
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DEEPGEMM_MULTICAST", "1")
    monkeypatch.setenv("DEEPGEMM_BN256", "0")
    monkeypatch.setenv("DEEPGEMM_TMA_STORE", "0")
    d = torch.empty(1, 1, dtype=torch.bfloat16)
    cfgs = [kernels.make_config("dense", True, d, None, 4096, 7168, 4096, 1),   # mcast 1: B shared, BM = 128
            kernels.make_config("dense", True, d, None, 7168, 16384, 1, 1),     # mcast 2: A shared, K split
            kernels.make_config("dense", False, d, None, 4096, 7168, 4096, 1)]  # BF16, mcast 1
    assert [c.mcast for c in cfgs] == [1, 2, 1] and cfgs[1].ksplit == 1
    for cfg in cfgs:
        cubin, rec = compiler.build("deepgemm_kernel", kernels.kernel_source(cfg), backend="nvcc")
        assert "0 bytes spill stores" in rec.ptxas and "C75" not in rec.ptxas, (cfg, rec.ptxas)
        path = tmp_path / "k.cubin"
        path.write_bytes(cubin)
        tools = _sass_tools()
        env = dict(os.environ, PATH=tools + os.pathsep + os.environ.get("PATH", ""))
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", str(path)], capture_output=True, text=True,
                              timeout=60, check=True, env=env).stdout
        ops = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M)
        assert "UTMALDG.2D.MULTICAST" in ops and "SYNCS.ARRIVE.TRANS64.RED.A1T0" in ops, cfg  # remote arrive
        gpu_membars = sum(op.startswith("MEMBAR") and op.endswith(".GPU") for op in ops)
        assert gpu_membars <= ops.count("UCGABAR_ARV"), (cfg, gpu_membars, ops.count("UCGABAR_ARV"))
        i = ops.index("SYNCS.ARRIVE.TRANS64.RED.A1T0")
        assert not any(op.startswith(("MEMBAR", "ERRBAR", "CGAERRBAR")) for op in ops[i - 4:i]), (cfg, ops[i - 4:i])
