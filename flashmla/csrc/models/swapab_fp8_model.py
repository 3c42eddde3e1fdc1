"""CPU model of the swap-AB decode kernel (../mla_decode_swapab_fp8.cu; FP8 cache, and the BF16 cache's
protocol). Update together.

layout: one request of a few pages replayed through the kernel's maps, in float64:
  - the dequantiser's thread -> (token, 8-column half) map per 16-token chunk, its swizzled stores
    (coverage exactly once, each quarter warp's 16-byte store on 8 distinct units and each half
    warp's 8-byte load on 16 distinct words: no bank conflict),
    the RoPE copy, zero rows past the length (the cache holds 0xFF = NaN there);
  for NR = 16 and NR = 32 query-row instantiations (wgmma N of S^T and O^T):
  - Q through the 64 x NR TMA box (128B swizzle) into 9 slabs of NR x 128 bytes;
  - S^T = K Q^T read through the wgmma descriptors (A K-major 64 rows, B K-major NR rows);
  - the m64nNR accumulator fragment (thread, index) -> (M row, N column), the softmax reductions
    (lanes xor 4/8/16, then 4 warps through sMax [4][NR]), online max/sum in the exp2 domain;
  - P^T stored per thread at swz128(row, key) and read back as the K-major B operand; V^T as the
    MN-major A operand of 8 m-tiles; hi/lo planes; the epilogue map back to out[row][col];
  and compares out and lse with attention on flashmla.dequantize_kvcache of the cache.
protocol: randomised interleavings of producer (bulk chunk ring, Q TMA after the first page's
  chunks), the dequantisers (NR = 16: two warpgroups on alternate chunks; NR = 32: one) and four consumer warps (mbarriers with their counts and parities,
  named barriers of the consumer warpgroup, sMax by page parity, sL by request parity, one P^T
  buffer), for the ring depths of both instantiations (NCH 4 and 3): no deadlock, every read sees
  the version it expects from start to end; and the BF16 cache's: the producer's TMA of whole pages,
  the consumer warps zeroing the V tail of a request's last page between the SMAX and PT barriers.
`--mutants` breaks one offset, count, wait or buffer at a time and asserts each is caught. ~5 s:

    python flashmla/csrc/models/swapab_fp8_model.py [--trials N] [--mutants]
"""
import math
import random
import sys

import numpy as np
import torch

from flashmla.quant import dequantize_kvcache, quantize_kvcache
from sim import MBar, NBar, expect_caught, simulate

SLAB, TILE, TOKEN, CH = 8192, 9 * 8192, 656, 16
NCH_OF = {16: 4, 32: 3}   # raw ring chunk slots of the NR = 16 / NR = 32 instantiations (SabLayout)


def swz(addr): return addr ^ (((addr >> 7) & 7) << 4)


def swz128(r, k): return r * 128 + ((((k >> 3) ^ r) & 7) << 4) + (k & 7) * 2


def bf16(x): return torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16).double().numpy()


# ------------------------------------------------------------------------------- layout
def dequant_page(raw, valid, mut=None):
    """raw uint8 [64, 656] -> the bf16 stage as float64 [TILE // 2] (NaN = never written)."""
    smem = np.full(TILE // 2, np.nan)
    written = np.zeros(TILE // 16, dtype=int)
    fp8 = torch.from_numpy(raw[:, :512].copy()).view(torch.float8_e4m3fn).float().numpy()
    scales = raw[:, 512:528].copy().view(np.float32)
    banks, loads = {}, {}
    for q in range(4):
        for t in range(128):
            w4, l = t >> 5, t & 31
            for i in range(4):
                tk = w4 + 4 * i
                row = q * CH + tk
                ok = row < valid or mut == "no_tail_zero"
                # half k: columns c..c+7 (c = c0, c0 + 128; c0 = 8(l & 15) + 256(l >> 4)) -> unit l&7 of slab c // 64
                c0 = 8 * (l & 15) + 256 * (l >> 4)
                for k, c in enumerate((c0, c0 + 128)):
                    src = 16 * l + 8 * k if mut == "contiguous_16" else c  # byte offset of the 8-byte load
                    tile = (src // 128) if mut != "scale_index" else (l & 3)
                    with np.errstate(invalid="ignore", over="ignore"):
                        vals = bf16(fp8[row, src:src + 8] * scales[row, tile]) if ok else np.zeros(8)
                    slab, u = src // 64, (src % 64) // 8
                    addr = slab * SLAB + row * 128 + ((u ^ (row & 7)) << 4)
                    smem[addr // 2:addr // 2 + 8] = vals
                    written[addr // 16] += 1
                    banks.setdefault((q, t >> 3, i, k), []).append((addr % 128) // 16)
                    loads.setdefault((q, t >> 4, i, k), []).append((src % 128) // 8)
            rtk, ru = t >> 3, t & 7                                   # RoPE: 16 bytes of token rtk
            row = q * CH + rtk
            src = raw[row, 528 + 16 * ru:528 + 16 * ru + 16].copy().view(np.uint16)
            vals = torch.from_numpy(src.astype(np.int16)).view(torch.bfloat16).double().numpy()
            if row >= valid: vals = np.zeros(8)
            u = ru if mut == "rope_no_swizzle" else ru ^ (row & 7)
            addr = 8 * SLAB + row * 128 + (u << 4)
            smem[addr // 2:addr // 2 + 8] = vals
            written[addr // 16] += 1
            banks.setdefault((q, t >> 3, "rope"), []).append((addr % 128) // 16)
    assert (written == 1).all(), f"stage units written {written.min()}..{written.max()} times (want once)"
    for key, units in banks.items():
        assert len(set(units)) == 8, f"bank conflict in quarter warp {key}: units {units}"
    for key, words in loads.items():  # 8-byte loads: a half warp's 16 words in distinct bank pairs
        assert len(set(words)) == 16, f"bank conflict in half warp {key}'s load: words {words}"
    return smem


def q_slabs(qn, nr):
    """TMA of Q rows [nr, 576] (box 64 x nr, 128B swizzle) into 9 slabs of nr * 128 bytes."""
    smem = np.full(9 * SLAB // 2, np.nan)        # what lies past the 9 nr-row slabs of Q: not Q (NaN here)
    for j in range(9):
        for r in range(nr):
            for c in range(64):
                smem[(j * nr * 128 + swz(r * 128 + 2 * c)) // 2] = qn[r, 64 * j + c]
    return smem


def fetch_kmajor(smem, start, rows):  # [rows, 16] of a K-major SW128 operand, SBO = 1024
    i, j = np.meshgrid(np.arange(rows), np.arange(16), indexing="ij")
    e = (i % 8) * 64 + (i // 8) * 512 + (j % 8) + (j // 8) * 8
    return smem[swz(start + 2 * e) // 2]


def fetch_mnmajor_a(smem, start):  # [64 (M), 16 (K)] of an MN-major SW128 A operand, SBO = 1024
    mm, k = np.meshgrid(np.arange(64), np.arange(16), indexing="ij")
    e = mm + (k % 8) * 64 + (k // 8) * 512
    return smem[swz(start + 2 * e) // 2]


def frag(t, i):
    """m64nN accumulator: thread t (0..127), index i (0..N/2-1) -> (M row, N column)."""
    w4, lane = t >> 5, t & 31
    return w4 * 16 + (lane >> 2) + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (lane & 3) + (i & 1)


def cross_warp(vals, cols, nr, op, stride):
    """sMax / sL: lanes gq == 0 store their KC row values at w4 * stride + n, then every thread
    reduces (op) the 4 warps' entries ww * stride + n of its rows. vals [128, KC] -> [128, KC]."""
    sm = np.full(4 * max(stride, nr), np.nan)
    for t in range(0, 128, 4 * 8):
        for tt in range(t, t + 4):
            for k, n in enumerate(cols[tt]): sm[(tt >> 5) * stride + n] = vals[tt, k]
    return np.array([[op([sm[ww * stride + n] for ww in range(4)]) for n in cols[t]] for t in range(128)])


def run_request(pages, L, q, qrows, scale, lo, causal, s_q, h_q, mut=None, nr=16):
    """pages: list of raw uint8 [64, 656]. Returns out [qrows, 512], lse [qrows] as the kernel does
    (the NR-row instantiation: nr = 16 or 32, qrows <= nr)."""
    NF, KC, QSLAB = nr // 2, nr // 4, nr * 128
    stride = 16 if mut == "row_stride_16" else nr                      # sMax / sL: [4 warps][NR rows]
    qsm = q_slabs(np.vstack([q, np.zeros((nr - qrows, 576))]) if qrows < nr else q, nr)
    o = np.zeros((128, 8, NF))
    mrow, lrow = np.full((128, KC), -np.inf), np.zeros((128, KC))
    cols_all = np.array([[frag(t, i)[1] for i in range(NF)] for t in range(128)])     # [128, NF]
    cols = cols_all[:, [(k >> 1) * 4 + (k & 1) for k in range(KC)]]                   # [128, KC]: row of column k
    lim = np.array([[min(L, L - s_q + 1 + n // h_q) if causal and n < qrows else L for n in cols[t]]
                    for t in range(128)])
    kidx = [((i >> 2) << 1) | (i & 1) for i in range(NF)]                              # i -> column k
    for blk, raw in enumerate(pages):
        st = dequant_page(raw, L - blk * 64, mut)
        qoff = SLAB if mut == "q_slab_stride" else QSLAB
        sT = sum(fetch_kmajor(st, (kk >> 2) * SLAB + (kk & 3) * 32, 64)
                 @ fetch_kmajor(qsm, (kk >> 2) * qoff + (kk & 3) * 32, nr).T for kk in range(36))  # [64, nr]
        sacc = np.array([[sT[frag(t, i)] for i in range(NF)] for t in range(128)])
        keys = np.array([[blk * 64 + frag(t, i)[0] for i in range(NF)] for t in range(128)])
        lim8 = lim[:, kidx]
        with np.errstate(invalid="ignore"):
            sacc = np.where(keys < lim8, sacc * scale * math.log2(math.e), -np.inf)
        mx = np.full((128, KC), -np.inf)
        for i in range(NF): mx[:, kidx[i]] = np.maximum(mx[:, kidx[i]], sacc[:, i])
        for x in (4, 8, 16):                                   # shfl_xor over gq
            mx = np.maximum(mx, mx[np.arange(128) ^ x])
        if mut != "no_cross_warp_max":                        # sMax: max over the 4 warps' values
            mx = cross_warp(mx, cols, nr, max, stride)
        mn = np.maximum(mrow, mx)
        muse = np.where(mn == -np.inf, 0.0, mn)
        al = np.exp2(mrow - muse)
        mrow, lrow = mn, lrow * al
        p = np.exp2(sacc - muse[:, kidx])
        for i in range(NF): lrow[:, kidx[i]] += p[:, i]
        phi, plo = np.full(QSLAB // 2, np.nan), np.full(QSLAB // 2, np.nan)
        hi = bf16(p)
        for t in range(128):
            for i in range(NF):
                mrow_key, n = frag(t, i)
                key = mrow_key if mut != "pt_key_swapped" else (mrow_key & ~8) | ((i & 1) << 3)
                phi[swz128(n, key) // 2] = hi[t, i]
                plo[swz128(n, key) // 2] = bf16(p[t, i] - hi[t, i])
        o *= al[:, kidx][:, None, :]
        for mt in range(8):
            acc = np.zeros((64, nr))
            for ks in range(4):
                vt = fetch_mnmajor_a(st, mt * SLAB + ks * 2048)
                acc += vt @ fetch_kmajor(phi, ks * 32, nr).T
                if lo: acc += vt @ fetch_kmajor(plo, ks * 32, nr).T
            o[:, mt, :] += np.array([[acc[frag(t, i)] for i in range(NF)] for t in range(128)])
    for x in (4, 8, 16):
        lrow = lrow + lrow[np.arange(128) ^ x]
    lsum = cross_warp(lrow, cols, nr, sum, stride)            # sL over the 4 warps
    out, lse = np.full((qrows, 512), np.nan), np.full(qrows, np.nan)
    for t in range(128):
        for i in range(NF):
            r, n = frag(t, i)
            k = kidx[i]
            if n >= qrows: continue
            l = lsum[t, k]
            for mt in range(8):
                out[n, mt * 64 + r] = o[t, mt, i] * (1 / l if l > 0 else 0)
            lse[n] = (mrow[t, k] + math.log2(l)) * math.log(2) if l > 0 else math.inf
    return out, lse


def check_layout(seed, L, qrows, lo, causal, nr=16, mut=None):
    g = torch.Generator().manual_seed(seed)
    npg = (L + 63) // 64
    k = torch.randn(npg * 64, 576, generator=g) * torch.exp(0.5 * torch.randn(npg * 64, 1, generator=g))
    raw = quantize_kvcache(k.to(torch.bfloat16).view(npg, 64, 1, 576)).numpy().copy().reshape(npg * 64, TOKEN)
    raw[L:] = 0xFF                                                     # NaN values and scales past L
    kv = dequantize_kvcache(torch.from_numpy(raw.reshape(npg, 64, 1, TOKEN))).double().reshape(-1, 576)[:L]
    h_q = 2 if qrows % 2 == 0 else 1
    s_q = qrows // h_q
    q = bf16(torch.randn(qrows, 576, generator=g).numpy())
    scale = 576 ** -0.5
    s = q @ kv.numpy().T * scale
    if causal:
        for n in range(qrows):
            s[n, L - s_q + 1 + n // h_q:] = -np.inf
    ref_lse = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
    ref = np.exp(s - s.max(1, keepdims=True)) / np.exp(s - s.max(1, keepdims=True)).sum(1, keepdims=True) @ kv.numpy()[:, :512]
    out, lse = run_request([raw[64 * b:64 * b + 64] for b in range(npg)], L, q, qrows, scale, lo, causal, s_q, h_q, mut, nr)
    atol = 3e-5 if lo else 4e-3
    assert np.all(np.isfinite(out)), "non-finite output"
    assert np.allclose(out, ref, atol=atol, rtol=1e-5 if lo else 2e-2), f"out differs: max {np.abs(out - ref).max():.2e}"
    assert np.allclose(lse, ref_lse, atol=1e-9, rtol=1e-9), "lse differs"


LAYOUT_CASES = ((0, 150, 16, True, False, 16), (1, 64, 3, False, False, 16), (2, 70, 8, True, True, 16),
                (3, 1, 1, True, False, 16), (4, 130, 32, True, True, 32), (5, 64, 20, False, False, 32))
LAYOUT_MUTANTS = ("contiguous_16", "no_tail_zero", "scale_index", "rope_no_swizzle", "q_slab_stride", "no_cross_warp_max",
                  "pt_key_swapped", "row_stride_16")
# row_stride_16: sMax / sL indexed w4 * 16 + n as in the 16-row kernel; wrong for NR = 32 only


# ------------------------------------------------------------------------------- protocol
def run_protocol(reqs, seed, mut=None, NR=16, bf=False):
    """reqs: pages per request (0 = nothing in this part). Raises AssertionError on a race/deadlock.
    NR = 16: two dequantiser warpgroups D0 / D1 take chunks 0, 2 / 1, 3 of every page (128 arrivals
    each); the ring depth must be even, so that a slot always belongs to one of them (with an odd depth
    a warpgroup skips the other's phases of a slot, and its parity wait can pass on a phase it skipped:
    mutant "odd_ring"), and above 2 (with 2, a warpgroup waits for its next chunk to land in the slot it
    has not released yet: mutant "ring_2", the hang of session 15's 32-row experiment). NR = 32: one warpgroup, modelled as two halves D0 / D1 of 64 threads that both
    run every chunk.
    bf (BF16 cache): no dequantisers; the producer's TMA lands the whole stage on full[s] (count 1), as
    the stage's body N and the V-tail rows T.w that consumer warp w zeroes on a request's last page
    after the SMAX barrier (every warp's S has read them) and before the PT barrier (P V reads zeros)."""
    rnd = random.Random(seed)
    split = NR == 16
    NCH = 5 if mut == "odd_ring" else 2 if mut == "ring_2" else NCH_OF[NR]
    full_count = 128 if (not split or mut == "full_count_one_wg") else 256
    if bf: full_count = 128 if mut == "bf_full_count_128" else 1
    mb = {**{f"rf{c}": MBar(1) for c in range(NCH)},
          **{f"re{c}": MBar(64 if mut == "raw_empty_count_64" else 128) for c in range(NCH)},
          **{f"full{s}": MBar(full_count) for s in range(2)}, **{f"empty{s}": MBar(128) for s in range(2)},
          "qfull": MBar(1), "qempty": MBar(128)}
    nb = {k: NBar(k, parties=4) for k in ("SMAX", "PT", "SL")}  # the 4 consumer warps

    def producer():
        slot = phase = qn = 0
        for r, npg in enumerate(reqs):
            if npg == 0: continue
            for j in range(npg):
                for q in range(4):
                    if mut != "producer_skips_raw_empty":
                        yield ("wait", f"re{slot}", phase ^ 1)
                    yield ("expect", f"rf{slot}"); yield ("tma", f"R{slot}", ("C", r, j, q), f"rf{slot}")
                    slot += 1
                    if slot == NCH: slot, phase = 0, phase ^ 1
                if j == 0:
                    if mut != "q_without_wait": yield ("wait", "qempty", (qn & 1) ^ 1)
                    yield ("expect", "qfull"); yield ("tma", "Q", ("Q", r), "qfull"); qn += 1

    def producer_bf():
        it = qn = 0
        for r, npg in enumerate(reqs):
            if npg == 0: continue
            for j in range(npg):
                s = it & 1
                if mut != "bf_producer_skips_empty": yield ("wait", f"empty{s}", ((it >> 1) & 1) ^ 1)
                yield ("expect", f"full{s}", 5)
                for b in [f"N{s}"] + [f"T{s}.{w}" for w in range(4)]: yield ("tma", b, ("K", r, j), f"full{s}")
                if j == 0:
                    if mut != "q_without_wait": yield ("wait", "qempty", (qn & 1) ^ 1)
                    yield ("expect", "qfull"); yield ("tma", "Q", ("Q", r), "qfull"); qn += 1
                it += 1

    def dequant(gname):
        it = 0
        mine = ([0, 2] if gname == "D0" else [1, 3]) if split else range(4)
        n = 128 if split else 64  # arrivals of this actor
        for r, npg in enumerate(reqs):
            for j in range(npg):
                s = it & 1
                if not (mut == "dequant_skips_empty_wait" and gname == "D1"):
                    yield ("wait", f"empty{s}", ((it >> 1) & 1) ^ 1)
                # as the kernel: chunk k's NoPE bytes are read before the wait for chunk k + 1 (whose bytes are
                # read before chunk k is converted); chunk k's RoPE bytes are read at its conversion, then its
                # slot is released
                def slot_of(q):
                    g = 4 * it + q
                    return g % NCH, (g // NCH) & 1

                def read(q, part):
                    slot, phase = slot_of(q)
                    if part == "nope": yield ("wait", f"rf{slot}", phase)
                    yield ("rbeg", f"R{slot}", ("C", r, j, q))
                    if part == "rope" and mut == "raw_empty_before_read" and gname == "D0":  # frees mid-read
                        yield ("arrive", f"re{slot}", n)
                    yield ("rend", f"R{slot}", ("C", r, j, q))
                yield from read(mine[0], "nope")
                for k, q in enumerate(mine):
                    if k + 1 < len(mine):
                        yield from read(mine[k + 1], "nope")
                    yield from read(q, "rope")
                    yield ("write", f"N{s}.{gname}.{q}", ("K", r, j))
                    if not (mut == "raw_empty_before_read" and gname == "D0"):
                        yield ("arrive", f"re{slot_of(q)[0]}", n)
                yield ("arrive", f"full{s}", n)
                it += 1

    def stage_reads(s, r, j, tail="K"):
        if bf:
            return [(f"N{s}", ("K", r, j))] + [(f"T{s}.{w}", (tail, r, j)) for w in range(4)]
        if split:
            return [(f"N{s}.D{q % 2}.{q}", ("K", r, j)) for q in range(4)]
        return [(f"N{s}.{g}.{q}", ("K", r, j)) for g in ("D0", "D1") for q in range(4)]

    def consumer(w):
        it = qn = pg = rq = 0
        for r, npg in enumerate(reqs):
            if npg: yield ("wait", "qfull", qn & 1); qn += 1
            for j in range(npg):
                s = it & 1
                yield ("wait", f"full{s}", (it >> 1) & 1)
                rd = [("Q", ("Q", r))] + stage_reads(s, r, j)
                for b, v in rd: yield ("rbeg", b, v)
                for b, v in rd: yield ("rend", b, v)
                if j == npg - 1: yield ("arrive", "qempty", 32)
                if bf and j == npg - 1 and mut == "bf_zero_before_smax": yield ("write", f"T{s}.{w}", ("Z", r, j))
                par = 0 if mut == "smax_one_buffer" else pg & 1
                yield ("write", f"M{par}.{w}", ("M", pg)); yield ("nsync", "SMAX")
                for x in range(4): yield ("rbeg", f"M{par}.{x}", ("M", pg))
                for x in range(4): yield ("rend", f"M{par}.{x}", ("M", pg))
                last = bf and j == npg - 1  # (a request's last page: its tail rows are zeroed)
                if last and mut not in ("bf_zero_before_smax", "bf_no_tail_zero"): yield ("write", f"T{s}.{w}", ("Z", r, j))
                yield ("write", f"P.{w}", ("P", pg))
                if mut != "no_pt_barrier": yield ("nsync", "PT")
                rd = [(f"P.{x}", ("P", pg)) for x in range(4)] + stage_reads(s, r, j, "Z" if last else "K")
                for b, v in rd: yield ("rbeg", b, v)
                for b, v in rd: yield ("rend", b, v)
                yield ("arrive", f"empty{s}", 32)
                it += 1; pg += 1
            par = 0 if mut == "sl_one_buffer" else rq & 1
            yield ("write", f"L{par}.{w}", ("L", r)); yield ("nsync", "SL")
            for x in range(4): yield ("rbeg", f"L{par}.{x}", ("L", r))
            for x in range(4): yield ("rend", f"L{par}.{x}", ("L", r))
            rq += 1

    workers = {"PR": producer_bf()} if bf else {"PR": producer(), "D0": dequant("D0"), "D1": dequant("D1")}
    simulate({**workers, **{f"W{w}": consumer(w) for w in range(4)}}, mb, nb, rnd, slow=0.03, max_steps=400000)


def check_protocol(trials, mut=None, bf=False):
    """Half the trials with the 16-row instantiation, half with the 32-row one (bf: the BF16 cache's
    protocol, the same for both)."""
    n = 0
    for trial in range(trials):
        rng = random.Random(trial)
        reqs = [rng.choice([0, 0, 1, 1, 2, 3, 4]) for _ in range(rng.randint(1, 6))]
        for sch in range(4):
            run_protocol(reqs, trial * 100 + sch, mut, 16 if trial % 2 == 0 else 32, bf); n += 1
    return n


PROTOCOL_MUTANTS = ("raw_empty_count_64", "raw_empty_before_read", "producer_skips_raw_empty", "q_without_wait", "dequant_skips_empty_wait",
                    "sl_one_buffer", "no_pt_barrier", "full_count_one_wg", "odd_ring",
                    "ring_2")
BF_PROTOCOL_MUTANTS = ("bf_full_count_128", "bf_zero_before_smax", "bf_no_tail_zero", "bf_producer_skips_empty",
                       "no_pt_barrier", "q_without_wait")
# (sMax by page parity is belt and braces: one buffer is also safe, since a warp writes page t+1's
# maxima only after the PT barrier of page t, which every warp reaches after reading page t's; the
# model run with mutant "smax_one_buffer" passes, as it should)


if __name__ == "__main__":
    trials = int(sys.argv[sys.argv.index("--trials") + 1]) if "--trials" in sys.argv else 300
    for case in LAYOUT_CASES:
        check_layout(*case)
    print("swapab layout model (NR 16 and 32): dequantised stage, Q slabs, S^T, fragments, softmax reductions, P^T, V^T, "
          "epilogue == attention on dequantize_kvcache")
    n = check_protocol(trials)
    print("swapab protocol model ok:", n, "random schedules, no deadlock, no race")
    n = check_protocol(trials, bf=True)
    print("swapab BF16-cache protocol model ok:", n, "random schedules, no deadlock, no race")
    if "--mutants" in sys.argv:
        expect_caught(lambda mut: [check_layout(*c, mut=mut) for c in LAYOUT_CASES[:3] + LAYOUT_CASES[4:]], LAYOUT_MUTANTS)
        expect_caught(lambda mut: check_protocol(trials, mut), PROTOCOL_MUTANTS)
        expect_caught(lambda mut: check_protocol(trials, mut, bf=True), BF_PROTOCOL_MUTANTS)
        print("all", len(LAYOUT_MUTANTS) + len(PROTOCOL_MUTANTS) + len(BF_PROTOCOL_MUTANTS), "mutants caught")
