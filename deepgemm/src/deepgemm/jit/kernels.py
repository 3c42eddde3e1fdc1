"""Host side of the SM90 kernels: block-size choice, source generation, tensor maps, launch.

Every kernel is `gemm_body<KIND, FP8, OUT, CT, N, K, BM, BN, STAGES>` from
include/deepgemm/sm90_gemm.cuh, instantiated by a generated `extern "C"` wrapper and compiled
once per parameter set (deepgemm.jit.compiler caches the cubin on disk)."""
from __future__ import annotations

import ctypes
import functools
import os
import threading
import warnings
from dataclasses import asdict, dataclass, replace

import torch

from ..utils import ceil_div, get_num_sms
from . import compiler, runtime

EPILOGUE_DEFAULT = "staged"  # DEEPGEMM_EPILOGUE=direct|staged overrides (BF16 output only)
# FP8 with BM = 64: split K between two consumer warpgroups; DEEPGEMM_KSPLIT=0|1 overrides.
# On by default since the pipeline depth under the split is even (max_stages): with an odd depth the
# two warpgroups' mbarrier phases aliased and CUDA-graph replays failed (scripts/repro_masked.py,
# H200 2026-11-29: even depths 0/200 replays wrong, odd-depth controls fail).
KSPLIT_DEFAULT = "1"
# FP8 block N at M <= 128: "fill" (any multiple of 8: a tile on nearly every SM; the measured default)
# or "pow2" (16/32/64/128: fewer, wider tiles, as in run 1); DEEPGEMM_SMALL_M_BN=fill|pow2 overrides.
SMALL_M_BN_DEFAULT = "fill"
SMALL_M = 128
# FP8, dense/masked, M <= 16: swap-AB kernel (sm90_gemm_swap.cuh) computing D^T = B A^T;
# DEEPGEMM_SWAP_AB=0|1|2 overrides (2: two K blocks in flight). Off by default: compile-checked, not measured.
SWAP_AB_DEFAULT = "0"
SWAP_MAX_M = 16
# FP8 (with the K split: >= 4 stages) and split-K: two K blocks in flight per consumer warpgroup; DEEPGEMM_PIPE=0|1|auto.
# auto (default): on for FP8 dense GEMMs with 16 < M <= SMALL_M (+2 % geo-mean at M = 64 / 128, up to +8 %,
# BENCHMARKS.md run 13c), off elsewhere (within noise at M = 4096, run 4; mixed at M = 1).
PIPE_DEFAULT = "auto"
PIPE_AUTO_MIN_M = 17
# 2-CTA clusters sharing one operand through TMA multicast: dense BM = 128 tiles in pairs along M share
# B (mcast 1); otherwise dense/masked tiles in pairs along N share A (mcast 2: small M, where every CTA
# re-reads the same A rows); DEEPGEMM_MULTICAST=0|1 overrides. Off by default: the first H200 run was ~2x slower
# (a GPU-scope memory barrier per K block in the remote stage release, since removed); not yet re-measured.
MULTICAST_DEFAULT = "0"
# FP8 128 x 256 tiles at M > 128 (each consumer warpgroup: 64 rows x two 128-column halves per K block):
# 25 % fewer L2 -> SM bytes and ~10 % less shared-memory traffic per FLOP than 128 x 128 (BENCHMARKS.md,
# "prepared"); DEEPGEMM_BN256=0|1|2 overrides (2: the same tiles with A read from registers: one ldmatrix pass
# per K block feeds both halves' WGMMAs). On (1) by default: H200 2026-11-29, +9 to +26 % on the M = 4096 shapes
# that switch (BENCHMARKS.md); 2 measured no faster than 1 and spills in one staged configuration.
BN256_DEFAULT = "1"
# Per-FLOP tensor-core cost of a tile width that straddles B's 128-column scale blocks (112, 96, 56, ...) at
# M > SMALL_M. H200 tune run (BENCHMARKS.md, session 11: tune_f703b0b.json): at M = 4096, 128 x 112 and
# 128 x 96 tiles ran at 0.83-0.92x and 0.77-0.78x the per-FLOP rate of 128 x 128 (the model without this
# said 0.93 and 0.86), which made it pick 128 x 112 at N = 2112 where 128 x 128 measured 1.11x faster.
# Not applied at M <= 128, where those runs differ by less than their noise.
STRADDLE_COST = 1.2
# Small M (FP8 dense, 64 < M <= SMALL_M, where 128-row tiles run two K blocks in flight): the bytes a 64-row tile
# streams cost this much more than a 128-row one's. (Its two warpgroups take alternate K blocks and add their
# partial tiles at the end.) H200 (BENCHMARKS.md run 28), tiles of one wave: at M = 128, 128 x 64 ran 1.04-1.14x
# faster than 64 x 112 at N = 7168 (9 % more bytes per SM) and 128 x 32 0.94-1.03x as fast as 64 x 64 at N = 4096
# (25 % more), so the factor lies between 1.09 and 1.25.
SMALL_M_BM64_COST = 1.15
BN256_COST = 0.9  # the model's per-FLOP cost of a 128 x 256 tile relative to 128 x 128 (smem bytes per FLOP: 144.5 / 161)
# BF16 output, staged epilogue, BN a multiple of 64 (grouped layouts: M, or expected_m, >= BM; masked only under
# =1): the tile leaves through TMA stores of swizzled 64 x 64 boxes (no LDS/STG copy-out; the warpgroups start the
# next tile while the TMA engine writes; a grouped box holding rows that must stay untouched is stored directly);
# DEEPGEMM_TMA_STORE=0|1|auto overrides. auto (default): on for K <= TMA_STORE_MAX_K, where the epilogue is a
# large share of a tile's time (H200 2026-11-29: +5 to +26 % at K 512-2048, -1 to -6 % at K 7168-16384).
TMA_STORE_DEFAULT = "auto"
TMA_STORE_MAX_K = 2048
# Persistent grid no larger than the tile waves need: ceil(tiles / ceil(tiles / SMs)) CTAs (same number of
# waves, fewer busy SMs: less power, so higher clocks, as DeepGEMM does); DEEPGEMM_MIN_SMS=0|1 overrides.
# Off by default: measured no faster (BENCHMARKS.md run 9).
MIN_SMS_DEFAULT = "0"
# Cross-CTA split-K for FP8 dense GEMMs at M <= 128 (one M tile row: without it every CTA streams all of A
# over the whole K range): S slices of the K blocks per tile, FP32 partials in a cached workspace, the last
# CTA of a tile sums them in slice order (sm90_gemm.cuh, SPLITK). DEEPGEMM_SPLIT_K=0|auto|<S> overrides.
# Default auto: the cost model's tiles and S where it predicts at least 1 / SPLIT_K_GAIN; measured on H200
# (BENCHMARKS.md run 10) +5 to +21 % where it splits, and the unsplit kernel elsewhere.
SPLIT_K_DEFAULT = "auto"
SPLIT_K_MAX = 16
# auto splits only where the model's cost is below this fraction of the unsplit choice's. Run 10 (H200, M = 64
# and 128): splits the model rated 0.83-0.88 won 5-21 %, those rated 0.90-0.94 lost 2-8 % (N = 4096, K = 7168;
# N = 7168, K = 16384 at M = 64)
SPLIT_K_GAIN = 0.885
# Above GEMV_MAX_M, where the unsplit tile would be SPLIT_K_THIN_BN wide and its K loop at least
# SPLIT_K_THIN_MIN_KB blocks long (N = 2112 at M = 17-32: 2 KB of B per stage, a latency-bound chain), auto
# splits wherever the model predicts any gain. Run 22 (H200): at N = 2112, K = 7168 the model rated these splits
# 0.89-0.92 and they ran 1.29-1.41x faster; over N = 256-2112, K = 2048-7168, M = 24-128, 1.01-1.45x; at
# K = 1536 0.87-1.00x, hence the minimum. (At M <= GEMV_MAX_M the small-M kernel takes these shapes.)
SPLIT_K_THIN_BN = 16
SPLIT_K_THIN_MIN_KB = 16
SPLIT_K_GAIN_THIN = 1.0
# Programmatic dependent launch: every kernel is launched with the PDL attribute, so that in a stream (or CUDA
# graph) of such kernels the next one's launch and prologue overlap the tail of the one before (each waits in
# grid_dep_wait, sm90_gemm.cuh, before its first global access). DEEPGEMM_PDL=0|1 overrides. On by default:
# H200 2026-11-29 (BENCHMARKS.md run 12), dense geo-mean vs cuBLAS blockwise 1.16x -> 1.21x, +6 to +12 % at
# M <= 128 (none at K = 16384), within noise at M = 4096. (An L2 prefetch of the first B boxes before the wait
# measured slower.)
PDL_DEFAULT = "1"
# FP8 dense at M <= GEMV_MAX_M: the small-M kernel (sm90_gemv.cuh: warp-level MMAs, each warp streaming 16 rows of
# B through a TMA ring of its own, the K blocks of a row group split over the warps of a CTA). DEEPGEMM_GEMV=0|1|auto:
# auto (default) takes it where the TMA kernels' unsplit tiles would be at most GEMV_MAX_TMA_BN wide (BN 16 at
# N = 2112, 32 at N = 4096: 2-4 KB of B per stage, too few bytes in flight) and no switch forces a TMA kernel
# (DEEPGEMM_BLOCKS, an integer DEEPGEMM_SPLIT_K, DEEPGEMM_SWAP_AB); 1 takes it at every FP8 dense M <= 16.
# H200 (BENCHMARKS.md run 21b, M = 1-16): 1.61-1.75x at N = 2112, 1.16-1.30x at N = 4096, 0.77-0.94x on the
# wider shapes.
# DEEPGEMM_GEMV_KS=1|2|4|8 forces its K slices per 16 rows (tuning).
GEMV_DEFAULT = "auto"
GEMV_MAX_M = 16
GEMV_MAX_TMA_BN = 32
GEMV_WARPS = 8  # kGemvWarps in sm90_gemv.cuh
# A's scales once per CTA (FP8 dense, M <= SMALL_M; DEEPGEMM_SFA_ONCE=0|1|auto): one TMA box of all rows and K
# blocks (under split-K: the CTA's slice) instead of a third box per stage. "1": wherever the ring keeps at least
# min(its plain depth, SFA_ONCE_MIN_STAGES) stages. "auto" (default): the same, but only at M > 16 without split-K
# and with >= SFA_ONCE_MIN_KB K blocks. H200 (BENCHMARKS.md run 34f, best of 4): 64 x 4096 x 7168 1.06x,
# 128 x 4096 x 7168 1.05x, 64 x 7168 x 16384 1.03x, 64 x 4096 x 28672 (64 x 32) 1.08x; elsewhere 0.98-1.01x
# (split-K, K <= 2048) but 0.94x at 128 x 32768 x 512.
SFA_ONCE_DEFAULT = "auto"
SFA_ONCE_MIN_STAGES = 8
SFA_ONCE_MIN_KB = 32
# DEEPGEMM_L2_HINT=0|1|auto: B's TMA boxes carry an L2 evict_first hint, so that B leaves the L2 before what is read
# again (A, the scales, split-K's partials). "auto" (default): at M <= L2_HINT_MAX_M (one M block, or two in the same
# wave, read each B tile), not for the grouped-contiguous layout. H200 (BENCHMARKS.md runs 36-37, best of
# 3): M <= 128 dense 0.98-1.09x (geo 1.03), masked 1.02-1.04x; M = 256-1024 0.98-0.99x, 4096 x 7168 x 16384 0.95x.
L2_HINT_DEFAULT = "auto"
L2_HINT_MAX_M = 128
# DEEPGEMM_BLOCKS="BMxBN" forces the block sizes (tuning: scripts/tune_blocks.py); unset: the cost model.
SMEM_LIMIT = 232448  # max dynamic shared memory per block on sm_90
KINDS = {"dense": 0, "contiguous": 1, "masked": 2}
OUT_CODE = {torch.bfloat16: 0, torch.float32: 1, torch.float8_e4m3fn: 2}
C_CODE = {None: 0, torch.float32: 1, torch.bfloat16: 2}
BLOCK_MS = (64, 128)
BLOCK_NS_FP8 = tuple(range(16, 129, 8))   # a tile spans at most two 128-wide B scale blocks
BLOCK_NS_FP8_POW2 = (16, 32, 64, 128)
BLOCK_NS_BF16 = tuple(range(16, 257, 16))
BLOCK_N_FP8_WIDE = 256  # FP8, BM = 128 only: two 128-column halves (DEEPGEMM_BN256 / DEEPGEMM_BLOCKS=128x256)
# FP8, BM = 128, M > SMALL_M (with the wide tiles, under DEEPGEMM_BN256): tiles start on multiples of 64, so a
# 192-wide one spans two B scale blocks at most and runs the plain main loop (m64n192k32 WGMMAs). It straddles, so
# the model charges it STRADDLE_COST per FLOP (not BN256_COST): it then replaces 128 x 96 in as many waves (H200
# run 31: 26 shapes 1.02-1.38x), not 128 x 128 in fewer at N = 2112 (measured 0.90-0.95x there).
BLOCK_N_FP8_192 = 192


@dataclass(frozen=True)
class Config:
    kind: int
    fp8: bool
    out: int
    ct: int
    n: int
    k: int
    bm: int
    bn: int
    stages: int
    epi: int = 0  # 1: staged (shared memory, 16-byte coalesced stores) BF16 epilogue
    ksplit: int = 0  # 1 (FP8, BM = 64): two consumer warpgroups take alternate K blocks
    swap: int = 0  # 1 / 2 (FP8, M <= 16): swap-AB kernel (2: pipelined); bm = rows of A per tile (8 / 16), bn = 64
    pipe: int = 0  # 1 (FP8; K split: >= 4 stages): two K blocks in flight per consumer warpgroup
    mcast: int = 0  # 2-CTA clusters: 1 multicast B (dense, BM = 128, even M blocks); 2 multicast A (even N blocks)
    tstore: int = 0  # 1 (BF16 out, staged, BN % 64 == 0): epilogue through TMA stores
    min_sms: int = 0  # 1: launch only as many CTAs as the waves of tiles need (launch_grid)
    rs: int = 0  # 1 (FP8 BN = 256): WGMMAs take A from registers (DEEPGEMM_BN256=2)
    splitk: int = 0  # S >= 2 (FP8 dense, M <= 128): cross-CTA split-K into S slices of K (DEEPGEMM_SPLIT_K)
    pdl: int = 0  # 1: launched as a programmatic dependent (DEEPGEMM_PDL; the launch only, like min_sms)
    gemv: int = 0  # 1 / 2 (FP8 dense, M <= 8 * gemv): the small-M kernel (sm90_gemv.cuh); bm = 8 * gemv, bn = 16
    gemv_ks: int = 0  # its K slices per 16 rows of B (1, 2, 4 or 8)
    sfa_rows: int = 0  # > 0 (FP8 dense, M <= sfa_rows): A's scales of all rows and K blocks loaded once per CTA
    l2b: int = 0  # 1: B's TMA loads with an L2 evict_first hint (DEEPGEMM_L2_HINT; the source defines DG_L2_EVICT_FIRST_B)

    @property
    def threads(self) -> int:
        if self.gemv:
            return 32 * GEMV_WARPS
        if self.swap:
            return 256
        return 128 * ((2 if self.ksplit else self.bm // 64) + 1)


def smem_bytes(fp8: bool, k: int, bm: int, bn: int, stages: int, epi: int = 0, ksplit: int = 0, swap: int = 0,
               tstore: int = 0, sfa_rows: int = 0, splitk: int = 0) -> int:
    """Must equal SmemPlan<...>::kTotal in sm90_gemm.cuh (SwapPlan in sm90_gemm_swap.cuh for swap)."""
    if swap:
        return 1024 + stages * (bm * 128 + 64 * 128 + 128) + 16 * stages  # A's scales padded to 128 B
    sfa = bm * 4 if fp8 and not sfa_rows else 0
    once = sfa_rows * sfa_blocks(k, splitk) * 4 + 16 if sfa_rows else 0  # the scales and their mbarrier
    ew = 64 if (fp8 and bn > 128) else bn  # FP8 BN = 256: staged epilogue in 64-column passes
    staging = (bm // 64) * 64 * (ew * 2 + 16) if epi else 0
    if tstore:  # one 8 KB swizzled 64 x 64 BF16 box per warpgroup and 64-column pass
        staging = (bm // 64) * (bn // 64) * 8192
    red = 128 * (bn // 2) * 4 if ksplit else 0
    return 1024 + stages * (bm * 128 + bn * 128 + sfa) + once + 16 * stages + staging + red


def max_stages(fp8: bool, k: int, bm: int, bn: int, cap: int = 12, epi: int = 0, ksplit: int = 0, swap: int = 0,
               tstore: int = 0, sfa_rows: int = 0, splitk: int = 0) -> int:
    """Deepest pipeline that fits in shared memory (no deeper than the K blocks). With the K split
    the depth is even, so that every stage is always consumed by the same warpgroup (see
    stages_ok_for_ksplit)."""
    kb = k // (128 if fp8 else 64)
    s = cap
    while s > 1 and smem_bytes(fp8, k, bm, bn, s, epi, ksplit, swap, tstore, sfa_rows, splitk) > SMEM_LIMIT:
        s -= 1
    s = max(1, min(s, max(kb, 2)))
    if ksplit and s % 2:
        s -= 1
    return s


def forced_stages(env: str, depth, ksplit: int) -> int:
    """The tiled kernels' pipeline depth: depth() (max_stages of the tile, capped at 12) or, under
    DEEPGEMM_STAGES=<S> (tuning), S: at most the deepest ring that fits and even under the K split."""
    if not env:
        return depth()
    deepest = depth(cap=64)
    if not env.isdigit() or not 1 <= int(env) <= deepest or (ksplit and int(env) % 2):
        raise ValueError(f"DEEPGEMM_STAGES: expected an integer 1..{deepest} (the deepest ring that fits"
                         f"{'; even under the K split' if ksplit else ''}), got {env!r}")
    return int(env)


def stages_ok_for_ksplit(stages: int) -> bool:
    """The K split's two consumer warpgroups take alternate K blocks (kb % 2) and each waits only on
    the full barriers of its own blocks. With an odd number of stages a stage alternates between the
    warpgroups, so a warpgroup skips the other's phase of that barrier; `mbarrier.try_wait.parity`
    only tells a phase from the one before it, so if the other warpgroup's TMA load into the stage has
    not landed yet (TMA loads may complete out of order) the wait passes at once: the warpgroup reads a
    stage still being written and releases it early, after which the producer and the barriers are
    out of step (ci/gpu's intermittent launch failure ran with 7 stages). With an even number of stages
    a stage belongs to one warpgroup within a tile, and named barrier 3 orders the warpgroups at every
    tile end (tests/pipeline_model.py checks both claims)."""
    return stages % 2 == 0


def straddles(bn: int) -> bool:
    """Whether tiles BN wide cross the 128-column blocks of B's scales (so that each promotion picks one of
    two scales per column): every width that neither divides 128 nor is a multiple of it."""
    return bool(128 % bn and bn % 128)


def tile_cost(bm: int, bn: int, compute_bound: bool = False, rows: int = 0) -> float:
    """Relative time of one 128-wide K block of a tile on one SM: the larger of the tensor-core
    work (a single consumer warpgroup, BM = 64, idles while it rescales: x1.5) and the bytes
    streamed in (64 units per row of A or B: balances a 128x128 tile). compute_bound (M > SMALL_M):
    widths that straddle B's scale blocks (192 too) cost STRADDLE_COST more tensor-core time per FLOP.
    rows (FP8, 64 < M <= SMALL_M): the rows of A the fullest tile loads; such tiles wait on their bytes
    (the tensor-core term is left out), and 64-row tiles' bytes cost SMALL_M_BM64_COST more."""
    if rows:
        return (rows + bn) * 64.0 * (SMALL_M_BM64_COST if bm == 64 else 1.0)
    mma = bm * bn * (1.5 if bm == 64 else BN256_COST if bn == BLOCK_N_FP8_WIDE else 1.0)
    if compute_bound and straddles(bn):
        mma *= STRADDLE_COST
    load = (bm + bn) * 64.0
    return max(mma, load)


def split_k_bounds(kb: int, s: int) -> list[tuple[int, int]]:
    """K blocks [lo, hi) of each of the s slices of kb 128-wide K blocks, as the kernel cuts them
    (slice i: [i * kb // s, (i + 1) * kb // s); sizes differ by at most one, none empty for s <= kb)."""
    return [(i * kb // s, (i + 1) * kb // s) for i in range(s)]


# Small-M time model (microseconds), a least-squares fit to the 18 M <= 128 dense rows of H200 run 9
# (within 17 % of each, 6 % on average): a fixed cost per call (launch, pipeline fill, drain), a cost per
# K block on a CTA's serial chain, one per KB an SM pulls from L2 and one per MB of B streamed from HBM.
SMALL_M_FIT = (5.58, 0.0403, 0.0058, 0.168)
SPLIT_K_SYNC_US = 0.5  # the last unit's fenced counter atomic + barriers (an L2 round trip or two)


def small_m_time(m: int, n: int, k: int, num_sms: int, bm: int, bn: int, s: int = 1, mcast: bool = False) -> float:
    """Modelled time (us) of an FP8 dense GEMM at M <= 128 with BM x BN tiles and s K slices (1: no split).
    Split-K adds the last unit's tail: writing its FP32 partial, the counter, and reading the s partials back
    (charged twice the per-KB rate: a chain of dependent L2 round trips, not a prefetched TMA stream).
    mcast: 2-CTA clusters share A's boxes (each SM pulls half of them from L2)."""
    c0, c_blk, c_kb, c_mb = SMALL_M_FIT
    kb = k // 128
    units = ceil_div(max(m, 1), bm) * ceil_div(n, bn) * s
    chain = ceil_div(units, num_sms) * ceil_div(kb, s)  # K blocks one CTA works through, one after another
    grain = 16 if mcast else 8  # A box rows come in 8s; a cluster's two CTAs each pull half of them
    rows_a = min(bm, ceil_div(max(m, 1), grain) * grain) // (grain // 8)  # the rows that exist
    t = c0 + c_blk * chain + c_kb * chain * (rows_a + bn) * 128 / 1024 + c_mb * n * k / 1e6
    if s > 1:
        part_kb = bm * bn * 4 / 1024
        t += c_kb * (part_kb + 2 * s * part_kb) + SPLIT_K_SYNC_US
    return t


# Tail peel (FP8 dense, M > 2 * SMALL_M, no split-K): where the last M block's tiles are all that a last, partial
# wave of the persistent grid holds, those rows run as a second GEMM of M <= 128 (the small-M kernels: split-K,
# PIPE) after the first, which then needs one wave fewer. Taken where small_m_time predicts the second GEMM, plus
# PEEL_GAP_US between the two, shorter than the wave it saves: a tile's FLOPs at LARGE_M_TFLOPS (the M = 4096
# rows' rate, BENCHMARKS.md run 24) on one SM's share. H200 run 31: 1.00-1.15x on the 9 shapes tried where it peels
# (4096 x 2112 x 7168: 1.10x), 1.04x and 0.97x on two where it does not. DEEPGEMM_PEEL=0|1|auto: 1 peels wherever
# a wave is saved.
PEEL_DEFAULT = "auto"
LARGE_M_TFLOPS = 1150.0
PEEL_GAP_US = 2.0


def peel_rows(m: int, n: int, k: int, num_sms: int, bm: int, bn: int, env: str = PEEL_DEFAULT) -> int:
    """Rows [0, r) of an FP8 dense GEMM that run as the first of two launches (0: no peel), for BM x BN tiles."""
    if env not in ("0", "1", "auto"):
        raise ValueError(f"DEEPGEMM_PEEL: expected 0, 1 or auto, got {env!r}")
    if m <= 2 * SMALL_M:
        return 0
    mb, nb = ceil_div(m, bm), ceil_div(n, bn)
    if env == "0" or (mb - 1) * nb > (ceil_div(mb * nb, num_sms) - 1) * num_sms:
        return 0
    rest = m - (mb - 1) * bm
    split = choose_split_k(rest, n, k, num_sms)
    bm2, bn2, s = split if split else (*choose_blocks(rest, n, 1, num_sms), 1)
    wave_us = 2.0 * bm * bn * k / (LARGE_M_TFLOPS * 1e6 / num_sms)
    if env == "auto" and small_m_time(rest, n, k, num_sms, bm2, bn2, s) + PEEL_GAP_US >= wave_us:
        return 0
    return (mb - 1) * bm


def choose_split_k(m: int, n: int, k: int, num_sms: int, s_env: str = "auto",
                   mcast: bool = False) -> tuple[int, int, int] | None:
    """(BM, BN, S) for an FP8 dense GEMM with M <= SMALL_M under DEEPGEMM_SPLIT_K=s_env ("auto" or an
    integer S >= 2, capped at the K blocks and SPLIT_K_MAX), or None (no split: "0", M too large, one K
    block, or auto where small_m_time predicts less than a 1 / SPLIT_K_GAIN speed-up). mcast: tiles in
    2-CTA clusters sharing A (only widths that give an even number of N blocks)."""
    kb = k // 128
    if s_env == "0" or m > SMALL_M or kb < 2:
        return None
    s_fixed = None if s_env == "auto" else min(int(s_env), kb, SPLIT_K_MAX)
    if s_fixed is not None and s_fixed < 2:
        return None
    best = None
    for bm in BLOCK_MS:
        if bm > 64 and m <= 64:
            continue
        for bn in BLOCK_NS_FP8:
            if mcast and ceil_div(n, bn) % 2:
                continue
            for s in ((s_fixed,) if s_fixed else range(2, min(kb, SPLIT_K_MAX) + 1)):
                cand = (small_m_time(m, n, k, num_sms, bm, bn, s, mcast), s, -bn, bm)
                if best is None or cand < best[0]:
                    best = (cand, bm, bn, s)
    if best is None:
        return None
    if s_fixed is None:
        bm0, bn0 = choose_blocks(m, n, 1, num_sms)
        thin = bn0 <= SPLIT_K_THIN_BN and kb >= SPLIT_K_THIN_MIN_KB and m > GEMV_MAX_M
        gain = SPLIT_K_GAIN_THIN if thin else SPLIT_K_GAIN
        if best[0][0] >= gain * small_m_time(m, n, k, num_sms, bm0, bn0):
            return None
    return best[1], best[2], best[3]


GEMV_FILL_BLOCKS = 3  # a wave's pipeline fill and drain, in K blocks per warp
# Two CTAs per SM (228 KB of shared memory, 1 KB of it reserved per CTA): one CTA's launch and ring fill overlap
# the other's drain and reduction, and a dependent (PDL) launch finds room. H200 (BENCHMARKS.md runs 21, 21b): rings
# of 4 stages (3 at M > 8) two to an SM against 6-9 stages one to an SM: 1.07-1.21x at N = 2112 and 4096 (M = 1-16).
GEMV_CTAS_PER_SM = 2
GEMV_SMEM_LIMIT = (233472 - GEMV_CTAS_PER_SM * 1024) // GEMV_CTAS_PER_SM


def gemv_slices(n: int, k: int, num_sms: int, ks_env: str = "") -> int:
    """K slices per 16 rows of B for the small-M kernel (1, 2, 4 or 8, at most the K blocks). Its CTAs
    (GEMV_CTAS_PER_SM per SM; GEMV_WARPS warps = GEMV_WARPS / KS row groups x KS slices) run in waves, each as long
    as a warp's K blocks plus the fill: the count with the fewest waves x (blocks + GEMV_FILL_BLOCKS), the larger
    on a tie. ks_env (DEEPGEMM_GEMV_KS) forces the count (capped at the K blocks)."""
    kb = k // 128
    cap = max(s for s in (1, 2, 4, 8) if s <= kb)
    if ks_env:
        if ks_env not in ("1", "2", "4", "8"):
            raise ValueError(f"DEEPGEMM_GEMV_KS: expected 1, 2, 4 or 8, got {ks_env!r}")
        return min(int(ks_env), cap)
    groups = ceil_div(n, 16)
    slots = GEMV_CTAS_PER_SM * num_sms
    cost = {s: ceil_div(ceil_div(groups * s, GEMV_WARPS), slots) * (ceil_div(kb, s) + GEMV_FILL_BLOCKS)
            for s in (1, 2, 4, 8) if s <= cap}
    return min(cost, key=lambda s: (cost[s], -s))


def gemv_smem(mt: int, stages: int, k: int, ks: int) -> int:
    """Must equal GemvPlan<MT, STAGES, KPW>::kTotal in sm90_gemv.cuh."""
    ring, kpw = GEMV_WARPS * stages, ceil_div(k // 128, ks)
    return 1024 + ring * (2048 + 1024 * mt + 128) + GEMV_WARPS * (ceil_div(kpw * 4, 8) * 8) + ring * 8


def gemv_stages(mt: int, k: int, ks: int) -> int:
    """Each warp's ring: as deep as GEMV_SMEM_LIMIT allows, no deeper than its K blocks."""
    s = min(16, ceil_div(k // 128, ks))
    while s > 1 and gemv_smem(mt, s, k, ks) > GEMV_SMEM_LIMIT:
        s -= 1
    return s


def choose_blocks(m: int, n: int, groups: int, num_sms: int, fp8: bool = True,
                  small_m_bn: str = SMALL_M_BN_DEFAULT, bn256: bool = False, by_rows: bool = False) -> tuple[int, int]:
    """Block sizes minimising waves x per-tile cost for `groups` independent M x N problems.
    small_m_bn="pow2" restricts FP8 BN to powers of two when m <= SMALL_M; bn256 adds FP8 128 x 256
    tiles when m > SMALL_M. by_rows (where 128-row tiles run two K blocks in flight, PIPE): FP8 at
    64 < M <= SMALL_M, the pick of a model that costs the rows of A that exist and 64-row tiles'
    SMALL_M_BM64_COST may replace a 64-row tile by a 128-row one of about half the width, where that is at
    least 32 wide and its tiles still occupy 3/4 of the SMs (narrower or fewer: 0.88-1.04x, BENCHMARKS.md
    run 29). Without PIPE the 64-row tiles kept up (masked, run 28); choose_split_k's gain bars were fitted
    against the picks without it, and run 28 measured its splits faster there as they were."""
    if small_m_bn not in ("fill", "pow2"):
        raise ValueError(f"DEEPGEMM_SMALL_M_BN: expected 'fill' or 'pow2', got {small_m_bn!r}")
    bns = BLOCK_NS_BF16
    if fp8:
        bns = BLOCK_NS_FP8_POW2 if small_m_bn == "pow2" and m <= SMALL_M else BLOCK_NS_FP8
    pick = _cheapest_blocks(m, n, groups, num_sms, fp8, bns, bn256, False)
    if by_rows and fp8 and 64 < m <= SMALL_M and pick[0] == 64:
        bm, bn = _cheapest_blocks(m, n, groups, num_sms, fp8, bns, bn256, True)
        if bm == 128 and bn >= 32 and 4 * groups * ceil_div(n, bn) >= 3 * num_sms:
            return bm, bn
    return pick


def _cheapest_blocks(m, n, groups, num_sms, fp8, bns, bn256, by_rows) -> tuple[int, int]:
    best = None
    for bm in BLOCK_MS:
        wide = (BLOCK_N_FP8_192, BLOCK_N_FP8_WIDE) if fp8 and bn256 and bm == 128 and m > SMALL_M else ()
        rows = min(bm, ceil_div(m, 8) * 8) if by_rows else 0  # the rows of A the fullest tile loads (in 8s)
        for bn in bns + wide:
            tiles = groups * ceil_div(max(m, 1), bm) * ceil_div(n, bn)
            cost = ceil_div(tiles, num_sms) * tile_cost(bm, bn, m > SMALL_M, rows)
            # tie-breaks: fewer tiles (less re-reading of A and B), then the wider BN: 64 x 128 over 128 x 64
            # (FP8 BM = 64 splits K between its two warpgroups, which then read 25 % fewer shared-memory bytes
            # per FLOP than 128 x 64's; H200, masked 1 x 256 x 4096 x 7168: 1.29x)
            cand = (cost, tiles, -bn, -bm)
            if best is None or cand < best[0]:
                best = (cand, bm, bn)
    return best[1], best[2]


def parse_blocks(spec: str, fp8: bool) -> tuple[int, int]:
    """DEEPGEMM_BLOCKS="BMxBN" (e.g. "128x112"): BM in BLOCK_MS, BN a multiple of 8 (FP8: 16-128, or 192 or 256
    with BM = 128; BF16: 16-256)."""
    try:
        bm, bn = (int(v) for v in spec.lower().split("x"))
    except ValueError:
        raise ValueError(f"DEEPGEMM_BLOCKS: expected 'BMxBN' such as '128x112', got {spec!r}") from None
    bns = BLOCK_NS_FP8 if fp8 else BLOCK_NS_BF16
    if fp8 and bm == 128 and bn in (BLOCK_N_FP8_192, BLOCK_N_FP8_WIDE):
        return bm, bn
    if bm not in BLOCK_MS or bn not in bns:
        raise ValueError(f"DEEPGEMM_BLOCKS: BM must be one of {BLOCK_MS} and BN one of {bns[0]}..{bns[-1]} "
                         f"(step {bns[1] - bns[0]}) for {'FP8' if fp8 else 'BF16'}, got {spec!r}")
    return bm, bn


def sfa_blocks(k: int, splitk: int) -> int:
    """K blocks of A's scales loaded once per CTA: all, or under split-K a slice's (at most ceil(KB / S))."""
    return ceil_div(k // 128, splitk) if splitk else k // 128


def sfa_once(env: str, kind: str, fp8: bool, m: int, n: int, k: int, bm: int, bn: int, depth, splitk: int = 0,
             num_sms: int = 0) -> int:
    """sfa_rows under DEEPGEMM_SFA_ONCE=env (see SFA_ONCE_DEFAULT): the rows of A's M blocks where A's scales are
    loaded once per CTA, else 0. Only FP8 dense GEMMs with M <= SMALL_M, BN <= 128 and <= 256 K blocks in the box;
    under split-K only where no CTA gets a second unit (units <= the even part of num_sms: the box holds one slice);
    depth(sfa_rows=...) is the ring's depth with and without."""
    if env not in ("0", "1", "auto"):
        raise ValueError(f"DEEPGEMM_SFA_ONCE: expected 0, 1 or auto, got {env!r}")
    kb = k // 128
    if env == "0" or not fp8 or kind != "dense" or m > SMALL_M or bn > 128 or sfa_blocks(k, splitk) > 256:
        return 0
    if splitk and ceil_div(m, bm) * ceil_div(n, bn) * splitk > num_sms - num_sms % 2:
        return 0
    if env == "auto" and (splitk or kb < SFA_ONCE_MIN_KB or m <= GEMV_MAX_M):
        return 0
    rows = bm * ceil_div(m, bm)
    return rows if depth(sfa_rows=rows) >= min(depth(sfa_rows=0), SFA_ONCE_MIN_STAGES) else 0


def make_config(kind: str, fp8: bool, d: torch.Tensor, c, n: int, k: int, m_hint: int, groups: int) -> Config:
    """Kernel parameters for one call (memoised: this runs on every GEMM call)."""
    return _make_config(kind, fp8, d.dtype, None if c is None else c.dtype, n, k, m_hint, groups, get_num_sms(),
                        os.environ.get("DEEPGEMM_EPILOGUE", EPILOGUE_DEFAULT),
                        os.environ.get("DEEPGEMM_KSPLIT", KSPLIT_DEFAULT),
                        os.environ.get("DEEPGEMM_SMALL_M_BN", SMALL_M_BN_DEFAULT),
                        os.environ.get("DEEPGEMM_SWAP_AB", SWAP_AB_DEFAULT),
                        os.environ.get("DEEPGEMM_PIPE", PIPE_DEFAULT),
                        os.environ.get("DEEPGEMM_MULTICAST", MULTICAST_DEFAULT),
                        os.environ.get("DEEPGEMM_BLOCKS", ""),
                        os.environ.get("DEEPGEMM_BN256", BN256_DEFAULT),
                        os.environ.get("DEEPGEMM_TMA_STORE", TMA_STORE_DEFAULT),
                        os.environ.get("DEEPGEMM_MIN_SMS", MIN_SMS_DEFAULT),
                        os.environ.get("DEEPGEMM_SPLIT_K", SPLIT_K_DEFAULT),
                        os.environ.get("DEEPGEMM_PDL", PDL_DEFAULT),
                        os.environ.get("DEEPGEMM_GEMV", GEMV_DEFAULT),
                        os.environ.get("DEEPGEMM_GEMV_KS", ""),
                        os.environ.get("DEEPGEMM_STAGES", ""),
                        os.environ.get("DEEPGEMM_SFA_ONCE", SFA_ONCE_DEFAULT),
                        os.environ.get("DEEPGEMM_L2_HINT", L2_HINT_DEFAULT))


@functools.lru_cache(maxsize=4096)
def _make_config(kind, fp8, d_dtype, c_dtype, n, k, m_hint, groups, num_sms, epi_env, ksplit_env,
                 small_m_bn_env=SMALL_M_BN_DEFAULT, swap_env=SWAP_AB_DEFAULT, pipe_env=PIPE_DEFAULT,
                 mcast_env=MULTICAST_DEFAULT, blocks_env="", bn256_env=BN256_DEFAULT,
                 tstore_env=TMA_STORE_DEFAULT, min_sms_env=MIN_SMS_DEFAULT, split_k_env=SPLIT_K_DEFAULT,
                 pdl_env=PDL_DEFAULT, gemv_env=GEMV_DEFAULT, gemv_ks_env="", stages_env="",
                 sfa_once_env=SFA_ONCE_DEFAULT, l2_hint_env=L2_HINT_DEFAULT) -> Config:
    if gemv_env not in ("0", "1", "auto"):
        raise ValueError(f"DEEPGEMM_GEMV: expected 0, 1 or auto, got {gemv_env!r}")
    cfg = _choose_config(kind, fp8, d_dtype, c_dtype, n, k, m_hint, groups, num_sms, epi_env, ksplit_env,
                         small_m_bn_env, swap_env, pipe_env, mcast_env, blocks_env, bn256_env, tstore_env,
                         min_sms_env, split_k_env, stages_env, sfa_once_env)
    forced = swap_env != "0" or blocks_env or split_k_env != "auto"  # the user asked for a TMA kernel
    thin = cfg.bn <= GEMV_MAX_TMA_BN and not cfg.splitk  # the TMA kernel would keep few bytes in flight
    if (gemv_env == "1" or (gemv_env == "auto" and thin and not forced)) and fp8 and kind == "dense" \
            and m_hint <= GEMV_MAX_M:
        mt = 1 if m_hint <= 8 else 2
        ks = gemv_slices(n, k, num_sms, gemv_ks_env)
        cfg = Config(KINDS[kind], fp8, OUT_CODE[d_dtype], C_CODE[c_dtype], n, k, 8 * mt, 16,
                     gemv_stages(mt, k, ks), gemv=mt, gemv_ks=ks)
    if pdl_env not in ("0", "1"):
        raise ValueError(f"DEEPGEMM_PDL: expected 0 or 1, got {pdl_env!r}")
    if l2_hint_env not in ("0", "1", "auto"):
        raise ValueError(f"DEEPGEMM_L2_HINT: expected 0, 1 or auto, got {l2_hint_env!r}")
    b_read_in_one_wave = kind != "contiguous" and m_hint <= L2_HINT_MAX_M
    return replace(cfg, pdl=int(pdl_env), l2b=int(l2_hint_env == "1" or (l2_hint_env == "auto" and b_read_in_one_wave)))


def _choose_config(kind, fp8, d_dtype, c_dtype, n, k, m_hint, groups, num_sms, epi_env, ksplit_env,
                   small_m_bn_env, swap_env, pipe_env, mcast_env, blocks_env, bn256_env, tstore_env, min_sms_env,
                   split_k_env, stages_env="", sfa_once_env=SFA_ONCE_DEFAULT) -> Config:
    if swap_env not in ("0", "1", "2"):
        raise ValueError(f"DEEPGEMM_SWAP_AB: expected 0, 1 or 2, got {swap_env!r}")
    if min_sms_env not in ("0", "1"):
        raise ValueError(f"DEEPGEMM_MIN_SMS: expected 0 or 1, got {min_sms_env!r}")
    min_sms = int(min_sms_env)
    if fp8 and swap_env != "0" and m_hint <= SWAP_MAX_M and kind in ("dense", "masked"):
        bm = 8 if m_hint <= 8 else 16
        return Config(KINDS[kind], fp8, OUT_CODE[d_dtype], C_CODE[c_dtype], n, k, bm, 64,
                      max_stages(fp8, k, bm, 64, swap=1), 0, 0, int(swap_env), min_sms=min_sms)
    if bn256_env not in ("0", "1", "2"):
        raise ValueError(f"DEEPGEMM_BN256: expected 0, 1 or 2, got {bn256_env!r}")
    if split_k_env != "auto" and not (split_k_env.isdigit() and int(split_k_env) <= 1024):
        raise ValueError(f"DEEPGEMM_SPLIT_K: expected 0, auto or a slice count such as 4, got {split_k_env!r}")
    if mcast_env not in ("0", "1"):
        raise ValueError(f"DEEPGEMM_MULTICAST: expected 0 or 1, got {mcast_env!r}")
    split_mc = mcast_env == "1" and num_sms >= 2
    split = choose_split_k(m_hint, n, k, num_sms, split_k_env, split_mc) if fp8 and kind == "dense" else None
    if pipe_env not in ("0", "1", "auto"):
        raise ValueError(f"DEEPGEMM_PIPE: expected 0, 1 or auto, got {pipe_env!r}")
    pipe_on = pipe_env == "1" or (pipe_env == "auto" and kind == "dense" and PIPE_AUTO_MIN_M <= m_hint <= SMALL_M)
    if split is not None:  # FP8 dense, M <= 128: cross-CTA split-K, direct epilogue, no TMA store
        bm, bn, s = split
        if blocks_env:
            bm, bn = parse_blocks(blocks_env, fp8)
            if bn > 128:
                raise ValueError(f"DEEPGEMM_BLOCKS: split-K takes FP8 BN <= 128, got {blocks_env!r}")
        ksplit = int(bm == 64 and k >= 256 and ksplit_env == "1")
        depth = functools.partial(max_stages, fp8, k, bm, bn, ksplit=ksplit, splitk=s)
        sfa_rows = sfa_once(sfa_once_env, kind, fp8, m_hint, n, k, bm, bn, depth, s, num_sms)
        stages = forced_stages(stages_env, functools.partial(depth, sfa_rows=sfa_rows), ksplit)
        # multicast: pairs of N blocks (same M block and K slice) share A's boxes
        mcast = 2 if split_mc and ceil_div(n, bn) % 2 == 0 else 0
        # PIPE: each consumer warpgroup's K blocks in pairs, two in flight
        return Config(KINDS[kind], fp8, OUT_CODE[d_dtype], C_CODE[c_dtype], n, k, bm, bn, stages, 0, ksplit,
                      pipe=int(pipe_on and stages >= 2), mcast=mcast, min_sms=min_sms, splitk=s, sfa_rows=sfa_rows)
    bm, bn = choose_blocks(m_hint, n, groups, num_sms, fp8, small_m_bn_env, bn256_env != "0", pipe_on)
    if blocks_env:
        bm, bn = parse_blocks(blocks_env, fp8)
    epi = int(d_dtype == torch.bfloat16 and epi_env == "staged")
    ksplit = int(fp8 and bm == 64 and k >= 256 and ksplit_env == "1")
    if tstore_env not in ("0", "1", "auto"):
        raise ValueError(f"DEEPGEMM_TMA_STORE: expected 0, 1 or auto, got {tstore_env!r}")
    want_tstore = tstore_env == "1" or (tstore_env == "auto" and k <= TMA_STORE_MAX_K)
    # grouped layouts: only where whole 64-row boxes are the rule (the kernel stores other boxes directly);
    # masked only when forced (BENCHMARKS.md run 23: contiguous +4-6 %, masked 0.96-1.05x)
    grouped_ok = kind == "dense" or (m_hint >= bm and (kind == "contiguous" or tstore_env == "1"))
    tstore = int(want_tstore and epi == 1 and bn % 64 == 0 and grouped_ok)
    depth = functools.partial(max_stages, fp8, k, bm, bn, epi=epi, ksplit=ksplit, tstore=tstore)
    sfa_rows = sfa_once(sfa_once_env, kind, fp8, m_hint, n, k, bm, bn, depth)
    stages = forced_stages(stages_env, functools.partial(depth, sfa_rows=sfa_rows), ksplit)
    if ksplit and not stages_ok_for_ksplit(stages):
        raise AssertionError(f"deepgemm: K split with {stages} (odd) stages")
    wide = fp8 and bn == BLOCK_N_FP8_WIDE  # 128 x 256: its own two-halves mainloop, no PIPE / multicast
    rs = int(wide and bn256_env == "2")
    # with the K split each warpgroup holds two stages of its own: four at least (run 30: 1.00-1.04x at M = 24-64);
    # there DEEPGEMM_MULTICAST=1 keeps its pairs instead (the kernel has no PIPE with MCAST outside split-K)
    pipe = int(fp8 and not wide and pipe_on and stages >= 2 and (not ksplit or (stages >= 4 and mcast_env != "1")))
    # the two CTAs of a cluster take M blocks 2p and 2p + 1 (mcast 1) or N blocks 2p and 2p + 1 (mcast 2):
    # an even count of those, and a grid of >= 2 CTAs
    mcast = 0
    if mcast_env == "1" and not pipe and not wide and not tstore and num_sms >= 2:
        if kind == "dense" and bm == 128 and not ksplit and bn % 16 == 0 and ceil_div(m_hint, bm) % 2 == 0:
            mcast = 1
        elif kind in ("dense", "masked") and ceil_div(n, bn) % 2 == 0:
            mcast = 2
    return Config(KINDS[kind], fp8, OUT_CODE[d_dtype], C_CODE[c_dtype], n, k, bm, bn, stages, epi, ksplit, 0, pipe,
                  mcast, tstore, min_sms, rs, sfa_rows=sfa_rows)


# source generation
def wgmma_specialisation(bn: int, fp8: bool) -> str:
    """`Wgmma<BN, FP8>::mma`: one m64nBNk32 (FP8) / m64nBNk16 (BF16) WGMMA, A and B from shared memory."""
    nreg = bn // 2
    regs = ", ".join(f"%{i}" for i in range(nreg))
    if fp8:
        instr = f"wgmma.mma_async.sync.aligned.m64n{bn}k32.f32.e4m3.e4m3 {{{regs}}}, %{nreg}, %{nreg + 1}, p, 1, 1;"
    else:
        instr = f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.bf16.bf16 {{{regs}}}, %{nreg}, %{nreg + 1}, p, 1, 1, 0, 0;"
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(nreg))
    return (
        "namespace dg {\n"
        f"template <> struct Wgmma<{bn}, {'true' if fp8 else 'false'}> {{\n"
        f"  __device__ __forceinline__ static void mma(float (&d)[{nreg}], u64 da, u64 db, int scale_d) {{\n"
        f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{nreg + 2}, 0;\\n{instr}\\n}}\\n"\n'
        f"      : {outs}\n"
        f'      : "l"(da), "l"(db), "r"(scale_d));\n'
        "  }\n};\n}  // namespace dg\n"
    )


def _trailing_args(cfg: Config) -> str:
    """gemm_body's optional template arguments PIPE, MCAST, TSTORE, RS, SPLITK, SFA_ROWS, up to the last non-zero
    one."""
    vals = [cfg.pipe, cfg.mcast, cfg.tstore, cfg.rs, cfg.splitk, cfg.sfa_rows]
    while vals and not vals[-1]:
        vals.pop()
    return "".join(f", {v}" for v in vals)


def wgmma_rs_specialisation(n: int) -> str:
    """`WgmmaRS<N>::mma`: one FP8 m64nNk32 WGMMA with A from four registers, B from shared memory."""
    nreg = n // 2
    regs = ", ".join(f"%{i}" for i in range(nreg))
    a = ", ".join(f"%{nreg + i}" for i in range(4))
    instr = (f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 {{{regs}}}, {{{a}}}, %{nreg + 4}, p, 1, 1;")
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(nreg))
    return (
        "namespace dg {\n"
        f"template <> struct WgmmaRS<{n}> {{\n"
        f"  __device__ __forceinline__ static void mma(float (&d)[{nreg}], const u32 (&a)[4], u64 db, int scale_d) {{\n"
        f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{nreg + 5}, 0;\\n{instr}\\n}}\\n"\n'
        f"      : {outs}\n"
        f'      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));\n'
        "  }\n};\n}  // namespace dg\n"
    )


def _source_fields(cfg: Config) -> dict:
    """The configuration as the source's first line records it: min_sms and pdl only shape the launch (one
    kernel, one cache entry for either value), and a zero tstore, rs, splitk, gemv or gemv_ks is left out (the
    default kernels' first line as before)."""
    return {k: v for k, v in asdict(cfg).items()
            if k not in ("min_sms", "pdl")
            and not (k in ("tstore", "rs", "splitk", "gemv", "gemv_ks", "sfa_rows", "l2b") and v == 0)}


def _defines(cfg: Config) -> str:
    """Preprocessor switches the headers read ahead of them (none for the default kernels)."""
    return "#define DG_L2_EVICT_FIRST_B 1\n" if cfg.l2b else ""


def gemv_source(cfg: Config) -> str:
    return (
        f"// deepgemm kernel {_source_fields(cfg)}\n"
        + _defines(cfg) + compiler.read_header() + "\n" + compiler.read_header("deepgemm/sm90_gemv.cuh")
        + f'\nextern "C" __global__ void __launch_bounds__({cfg.threads}, {GEMV_CTAS_PER_SM}) deepgemm_kernel(\n'
        "    const __grid_constant__ dg::TmaDesc tma_a, const __grid_constant__ dg::TmaDesc tma_b,\n"
        "    const __grid_constant__ dg::TmaDesc tma_sfa, const float* sfb, void* d, const void* c, int M) {\n"
        f"  dg::gemv_body<{cfg.out}, {cfg.ct}, {cfg.n}, {cfg.k}, {cfg.gemv}, {cfg.gemv_ks}, {cfg.stages}>(\n"
        "      tma_a, tma_b, tma_sfa, sfb, d, c, M);\n"
        "}\n"
    )


def kernel_source(cfg: Config) -> str:
    if cfg.gemv:
        return gemv_source(cfg)
    if cfg.swap:
        body = "gemm_swap_body"
        args = f"{cfg.kind}, {cfg.out}, {cfg.ct}, {cfg.n}, {cfg.k}, {cfg.bm}, {cfg.stages}, {cfg.swap - 1}"
        headers = compiler.read_header() + "\n" + compiler.read_header("deepgemm/sm90_gemm_swap.cuh")
        mma_n = cfg.bm  # WGMMA's N is the rows of A
    else:
        body = "gemm_body"
        args = (f"{cfg.kind}, {'true' if cfg.fp8 else 'false'}, {cfg.out}, {cfg.ct}, {cfg.n}, {cfg.k}, "
                f"{cfg.bm}, {cfg.bn}, {cfg.stages}, {cfg.epi}, {cfg.ksplit}"
                + _trailing_args(cfg))
        headers = compiler.read_header()
        mma_n = 128 if cfg.fp8 and cfg.bn == BLOCK_N_FP8_WIDE else cfg.bn  # FP8 BN = 256: m64n128 WGMMAs per half
    return (
        f"// deepgemm kernel {_source_fields(cfg)}\n"
        + _defines(cfg) + headers
        + "\n" + wgmma_specialisation(mma_n, cfg.fp8)
        + (wgmma_rs_specialisation(mma_n) if cfg.rs else "")
        + f'\nextern "C" __global__ void __launch_bounds__({cfg.threads}, 1)'
        + (" __cluster_dims__(2, 1, 1)" if cfg.mcast else "") + " deepgemm_kernel(\n"
        "    const __grid_constant__ dg::TmaDesc tma_a, const __grid_constant__ dg::TmaDesc tma_b,\n"
        "    const __grid_constant__ dg::TmaDesc tma_sfa, const float* sfb, void* d, const void* c,\n"
        "    const int* grouped, int M, int num_groups, int a_box_rows, int sfa_box"
        + (", const __grid_constant__ dg::TmaDesc tma_d" if cfg.tstore else "")
        + (", float* ws, int* tile_ctr" if cfg.splitk else "") + ") {\n"
        f"  dg::{body}<{args}>(tma_a, tma_b, tma_sfa, sfb, d, c, grouped, M, num_groups, a_box_rows, sfa_box"
        + (", &tma_d" if cfg.tstore else "") + (", nullptr, ws, tile_ctr" if cfg.splitk else "") + ");\n"
        "}\n"
    )


def _build(cfg: Config):
    src = kernel_source(cfg)
    backend = compiler.choose_backend()
    try:
        return compiler.build("deepgemm_kernel", src, asdict(cfg), backend=backend)
    except RuntimeError as exc:
        if backend != "nvrtc" or compiler.nvcc_path() is None:
            raise
        warnings.warn(f"deepgemm: NVRTC failed, retrying with nvcc: {str(exc)[:300]}")
        return compiler.build("deepgemm_kernel", src, asdict(cfg), backend="nvcc")


_kernels: dict[Config, tuple[runtime.Kernel, Config]] = {}
_kernels_guard = threading.Lock()


def get_kernel(cfg: Config) -> tuple[runtime.Kernel, Config]:
    """The compiled kernel for cfg and the configuration it was built with: a pipelined (PIPE), multicast
    or A-from-registers (RS) kernel whose ptxas report shows spills is replaced by the plain one (launches follow
    the returned configuration: multicast changes the grid and the tensor-map boxes)."""
    hit = _kernels.get(cfg)
    if hit is not None:
        return hit
    with _kernels_guard:
        hit = _kernels.get(cfg)
        if hit is None:
            eff = cfg
            cubin, rec = _build(eff)
            for field in ("pipe", "mcast", "rs"):  # three register tiles / cluster bookkeeping / A registers did not fit
                if getattr(eff, field) and compiler.spills(rec.ptxas):
                    eff = replace(eff, **{field: 0})
                    cubin, rec = _build(eff)
            if eff.gemv:
                smem = gemv_smem(eff.gemv, eff.stages, eff.k, eff.gemv_ks)
            else:
                smem = smem_bytes(eff.fp8, eff.k, eff.bm, eff.bn, eff.stages, eff.epi, eff.ksplit, eff.swap, eff.tstore,
                                  eff.sfa_rows, eff.splitk)
            kern = runtime.Kernel(cubin, "deepgemm_kernel", smem)
            hit = _kernels[cfg] = (kern, eff)
    return hit


# launch
_NULL_DESC = runtime.TmaDesc()


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def sfa_tensor_map(sfa: torch.Tensor, box: int, box_kb: int = 1) -> runtime.TmaDesc:
    """A's scales, [(G,) M, KB] MN-major with the M stride padded to 4, as a tensor map over the row-major
    [(G *) KB, M_al] view: boxes of `box` rows of A in `box_kb` K blocks."""
    m_al = sfa.stride(-1) if sfa.shape[-1] > 1 else ceil_div(sfa.shape[-2], 4) * 4
    outer = sfa.shape[-1] * (sfa.shape[0] if sfa.dim() == 3 else 1)
    return runtime.tensor_map_2d(sfa.data_ptr(), runtime.DT_FLOAT32, sfa.shape[-2], outer, m_al * 4, box, box_kb,
                                 runtime.SWIZZLE_NONE)


def _launch(cfg: Config, a, sfa, b, sfb, d, c, grouped, m_sched: int, num_groups: int, tiles: int) -> None:
    kern, cfg = get_kernel(cfg)
    k, n = cfg.k, cfg.n
    kel = 128 if cfg.fp8 else 64
    dt = runtime.DT_UINT8 if cfg.fp8 else runtime.DT_BFLOAT16
    esize = a.element_size()
    rows_a, rows_b = a.numel() // k, b.numel() // k
    # small M: load only the rows that exist (rounded to the 8-row swizzle atom), not BM
    align = 16 if cfg.mcast == 2 else 8  # multicast of A: two halves of whole 8-row swizzle atoms
    a_box = min(cfg.bm, ceil_div(m_sched, align) * align)
    sfa_box = min(cfg.sfa_rows or cfg.bm, ceil_div(m_sched, 4) * 4)
    # multicast of A: each CTA of a cluster loads one half of the A box into both (a_box % 16 == 0)
    box_a = a_box // 2 if cfg.mcast == 2 else a_box
    tma_a = runtime.tensor_map_2d(a.data_ptr(), dt, k, rows_a, k * esize, kel, box_a, runtime.SWIZZLE_128B)
    # multicast: each CTA of a cluster loads one half of the B tile into both
    box_b = cfg.bn // 2 if cfg.mcast == 1 else cfg.bn
    tma_b = runtime.tensor_map_2d(b.data_ptr(), dt, k, rows_b, k * esize, kel, box_b, runtime.SWIZZLE_128B)
    tma_sfa = sfa_tensor_map(sfa, sfa_box, sfa_blocks(k, cfg.splitk) if cfg.sfa_rows else 1) if cfg.fp8 else _NULL_DESC
    vp = ctypes.c_void_p
    args = [tma_a, tma_b, tma_sfa,
            vp(sfb.data_ptr() if sfb is not None else 0), vp(d.data_ptr()),
            vp(c.data_ptr() if c is not None else 0), vp(grouped.data_ptr() if grouped is not None else 0),
            ctypes.c_int(m_sched), ctypes.c_int(num_groups), ctypes.c_int(a_box), ctypes.c_int(sfa_box)]
    if cfg.splitk:  # FP32 partials [tiles, S, BM * BN] and one int32 counter per tile (zero between launches)
        ws, ctr = split_k_workspace(d.device, tiles * cfg.bm * cfg.bn, tiles // cfg.splitk)
        args += [vp(ws.data_ptr()), vp(ctr.data_ptr())]
    if cfg.tstore:  # D as [M, N] BF16, 64 x 64 boxes, 128-byte swizzle (the kernel's shared-memory layout)
        args.append(runtime.tensor_map_2d(d.data_ptr(), runtime.DT_BFLOAT16, n, d.numel() // n, n * 2, 64, 64,
                                          runtime.SWIZZLE_128B))
    kern.launch(_device_index(d.device), launch_grid(cfg, tiles, get_num_sms()), cfg.threads, args,
                pdl=bool(cfg.pdl))


_workspaces: dict = {}
_retired: list = []  # replaced workspaces stay alive: a captured CUDA graph may still use them


def split_k_workspace(device: torch.device, floats: int, counters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 partials (>= floats; no initialisation needed: a launch writes every slot it reads) and int32 tile
    counters (>= counters, zero) for split-K launches on `device`, cached per device and grown when a call
    needs more (the kernel leaves the counters at zero, so they are zeroed only when allocated). All split-K
    GEMMs of a device share it: they must not run concurrently on two streams. While a CUDA graph is being
    captured a cache that is too small is not grown: the call gets buffers of its own (their zeroing is
    captured with it), so warm up eagerly before capturing to keep the graph free of that memset."""
    key = _device_index(device)
    hit = _workspaces.get(key)
    if hit is not None and hit[0].numel() >= floats and hit[1].numel() >= counters:
        return hit
    capturing = torch.cuda.is_current_stream_capturing()
    if hit is not None and not capturing:
        _retired.append(hit)
        floats, counters = max(floats, hit[0].numel()), max(counters, hit[1].numel())
    fresh = (torch.empty(max(floats, 1), dtype=torch.float32, device=device),
             torch.zeros(max(counters, 1), dtype=torch.int32, device=device))
    if capturing:
        _retired.append(fresh)
    else:
        _workspaces[key] = fresh
    return fresh


def launch_grid(cfg: Config, tiles: int, num_sms: int) -> int:
    """CTAs of the persistent grid: at most one per SM and one per tile; multicast: whole 2-CTA clusters,
    both CTAs of a cluster walking the same tiles / 2 tile pairs (Scheduler in sm90_gemm.cuh)."""
    if cfg.mcast:
        return 2 * max(1, min(num_sms // 2, tiles // 2))
    grid = max(1, min(num_sms, tiles))
    if cfg.min_sms:  # same number of waves on fewer SMs
        grid = max(1, ceil_div(tiles, ceil_div(tiles, grid)))
    return grid


def _check_sf_ptr(sfa: torch.Tensor) -> None:
    if sfa.data_ptr() % 16:
        raise ValueError("a scaling factors: expected a 16-byte aligned pointer after get_mn_major_tma_aligned_tensor")


def _launch_gemv(cfg: Config, a, sfa, b, sfb, d, c, m: int) -> None:
    kern, cfg = get_kernel(cfg)
    k, n, rows_a = cfg.k, cfg.n, 8 * cfg.gemv
    tma_a = runtime.tensor_map_2d(a.data_ptr(), runtime.DT_UINT8, k, m, k, 128, rows_a, runtime.SWIZZLE_128B)
    tma_b = runtime.tensor_map_2d(b.data_ptr(), runtime.DT_UINT8, k, n, k, 128, 16, runtime.SWIZZLE_128B)
    tma_sfa = sfa_tensor_map(sfa, ceil_div(m, 4) * 4)  # the kernel's transaction count assumes this box
    grid = ceil_div(ceil_div(n, 16) * cfg.gemv_ks, GEMV_WARPS)
    vp = ctypes.c_void_p
    args = [tma_a, tma_b, tma_sfa, vp(sfb.data_ptr()), vp(d.data_ptr()), vp(c.data_ptr() if c is not None else 0),
            ctypes.c_int(m)]
    kern.launch(_device_index(d.device), grid, cfg.threads, args, pdl=bool(cfg.pdl))


_peel_rows = functools.lru_cache(maxsize=4096)(peel_rows)


def gemm_nt(a, sfa, b, sfb, d, c) -> None:
    m, k = a.shape
    n = b.shape[0]
    fp8 = sfa is not None
    if fp8:
        _check_sf_ptr(sfa)
    cfg = make_config("dense", fp8, d, c, n, k, m, 1)
    peel_env = os.environ.get("DEEPGEMM_PEEL", PEEL_DEFAULT)
    r = _peel_rows(m, n, k, get_num_sms(), cfg.bm, cfg.bn, peel_env) if fp8 else 0
    if r and not os.environ.get("DEEPGEMM_BLOCKS") and not os.environ.get("DEEPGEMM_STAGES"):
        # the last M block's rows as a GEMM of their own (see peel_rows; M > 256, so cfg is neither split-K nor the
        # small-M kernel); row slices of A, its scales (MN-major: the slice keeps the M stride), D and C
        for lo, hi in ((0, r), (r, m)):
            c_part = None if c is None else c[lo:hi]
            part = make_config("dense", fp8, d[lo:hi], c_part, n, k, hi - lo, 1)
            _gemm_nt_once(part, a[lo:hi], sfa[lo:hi], b, sfb, d[lo:hi], c_part)
    else:
        _gemm_nt_once(cfg, a, sfa, b, sfb, d, c)


def _gemm_nt_once(cfg: Config, a, sfa, b, sfb, d, c) -> None:
    m = a.shape[0]
    if cfg.gemv:
        _launch_gemv(cfg, a, sfa, b, sfb, d, c, m)
        return
    tiles = ceil_div(m, cfg.bm) * ceil_div(cfg.n, cfg.bn) * max(cfg.splitk, 1)  # split-K: (tile, slice) units
    _launch(cfg, a, sfa, b, sfb, d, c, None, m, 1, tiles)


def m_grouped_gemm_nt_contiguous(a, sfa, b, sfb, d, m_indices) -> None:
    m, k = a.shape
    g, n, _ = b.shape
    fp8 = sfa is not None
    if fp8:
        _check_sf_ptr(sfa)
    cfg = make_config("contiguous", fp8, d, None, n, k, m, 1)
    tiles = ceil_div(m, cfg.bm) * ceil_div(n, cfg.bn)
    _launch(cfg, a, sfa, b, sfb, d, None, m_indices, m, g, tiles)


def m_grouped_gemm_nt_masked(a, sfa, b, sfb, d, masked_m, expected_m: int) -> None:
    g, m_max, k = a.shape
    n = b.shape[1]
    fp8 = sfa is not None
    if fp8:
        _check_sf_ptr(sfa)
    hint = min(max(expected_m, 1), m_max)
    cfg = make_config("masked", fp8, d, None, n, k, hint, g)
    tiles = g * ceil_div(m_max, cfg.bm) * ceil_div(n, cfg.bn)
    _launch(cfg, a, sfa, b, sfb, d, None, masked_m, m_max, g, tiles)
