"""CPU model of the register-fed swap-AB kernel (../mla_decode_swapab_rf.cu; FP8 cache, 1..32 query rows in its
NR = 16 and NR = 32 instantiations). Update together.

layout: requests of a few pages replayed through the kernel's maps in float64, f16 roundings emulated:
  - Q's conversion (the request's rows from global memory, 2^-E from the live rows' max |Q|, each k-step's columns
    permuted) into the f16 / bf16 tile of NR rows, read back as the K-major B operand;
  - K's A fragments: thread (warp, g, c) -> keys 16w + g (+ 8), word j of its 32 bytes per tile -> k-step and
    fragment k; each (key, k) written exactly once; per-tile accumulators and fp32 scales, RoPE unscaled;
  - the softmax over pages (exp2 domain, a column's reference max moved only when a page exceeds it by more than
    RF_MAX_SLACK, alpha, f16 P hi / lo);
  - V's A fragments: PRMT of two keys' words, scale / sigma in f16 (sigma: the page's largest scale of the warp's
    tile as a power of two), m-tile rows -> value columns d0 + 2mt (+ 1); O rescaled by sigma ratios; the epilogue;
  - FLASHMLA_FP8_Q=1: Q's NoPE part in e4m3 per row (2^e, its 4-byte groups permuted) as the e4m3 B operand, K's
    e4m3 A fragments straight from the raw bytes (m64nNRk32), S scaled by 2^e per query column;
  - FLASHMLA_FP8_PV=1 (16 rows, requests of >= min_keys keys): sigma per tile over the page's live scales, P^T as
    e4m3(p scale / sigma) stored by WG0's threads into the four tile planes (key pairs at 16 w4 + 2 gq), V's e4m3 A
    fragments by 4 x 4 byte transposes of one word per key (keys 32 ks + 8 (2h + o) + 2 cq + e), m-tile rows ->
    value columns 128 tl + 4 (8 w4 + gq) + 2 j + h; each page's products checked against the same P^T applied
    directly (exact in float64), then added to O^T;
  and compares out and lse with attention on dequantize_kvcache(k, float32) (0xFF bytes past every length; under
  FP8_Q with flashmla.testing.fp8_query's Q; under FP8_PV within 0.1 of the largest output, e4m3 P's rounding).
protocol: randomised interleavings of the producer (a ring of 4 page slots), the four warps of the S warpgroup (Q
  conversion, S, sMax by page parity, P^T and alpha by page parity, row sums and 1/l by request parity) and the four
  of the P V warpgroup (NR = 16: the page's V read, its slot released, then P^T; NR = 32: a quarter of V read, then
  P^T, then the rest and the slot), with the kernel's mbarrier counts and parities: no deadlock, every read sees
  the version it expects. (FLASHMLA_FP8_PV's per-warp scale maxima are written and read as sMax is, by page parity
  around the same barrier; its sigmas are written with alpha and read with it.)
`--mutants` breaks one map, count, wait or buffer at a time and asserts each is caught. ~40 s:

    python flashmla/csrc/models/swapab_rf_model.py [--trials N] [--mutants]
"""
import itertools
import math
import random
import sys

import numpy as np
import torch

from flashmla.quant import dequantize_kvcache, quantize_kvcache
from flashmla.testing import fp8_query
from sim import MBar, NBar, expect_caught, page_mixes, simulate

TOKEN, SLOTS, MAX_SLACK = 656, 4, 8.0


def swz128(r, k): return r * 128 + ((((k >> 3) ^ r) & 7) << 4) + (k & 7) * 2


def swz128_byte(r, c): return swz128(r, c >> 1) + (c & 1)  # byte c of row r (the e4m3 Q tile)


def f16(x):
    with np.errstate(over="ignore"):  # (rows past m overflow before they are zeroed, as in the kernel)
        return np.float16(x).astype(np.float64)


def e4m3(b): return float(torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).float())


E4M3 = [e4m3(b) if (b & 0x7F) != 0x7F else math.nan for b in range(256)]


def e4m3_rn(x):  # cvt.rn.satfinite to e4m3 (x >= 0), as float64
    return torch.tensor(np.minimum(x, 448.0), dtype=torch.float32).to(torch.float8_e4m3fn).double().numpy()


def prmt(a, b, sel):  # PRMT of two words given as byte lists: result byte i <- source byte (nibble i of sel)
    src = list(a) + list(b)
    return [src[(sel >> (4 * i)) & 7] for i in range(4)]


def rf_col(k, cq): return 8 * (k >> 1) + 2 * cq + (k & 1)


def pow2_ceil(x):
    if not x > 0: return 1.0
    return 2.0 ** min(max(math.ceil(math.log2(x)), -126), 126)


# ------------------------------------------------------------------------------- layout
def convert_q(q, m, mut):
    """q float64 [NR, 576] (rows >= m: the next request's, not read) -> (tile {byte address: value}, 2^E)."""
    nr = q.shape[0]
    qslab = nr * 128
    mx = max((abs(q[n, d]) for n in range(m) for d in range(512)), default=0.0)
    e = 0
    if mx > 0:
        e = min(max(math.ceil(math.log2(mx)) - 15, -126), 126)
    down = 2.0 ** -e
    tile = {}
    for t in range(128):
        for hh in range(nr // 16):
            n, ch = (t >> 3) + 16 * hh, t & 7
            for sl in range(9):
                src = [q[n, 64 * sl + 8 * ch + i] if n < m else 0.0 for i in range(8)]
                for h in range(2):
                    d0 = 8 * ch + 4 * h
                    v = src[4 * h:4 * h + 4]
                    if sl < 8:
                        d = 64 * sl + d0
                        r = d & 127
                        kk, cc = 8 * (d >> 7) + ((r >> 2) & 7), r >> 5
                        v = [f16(x * down) for x in v]
                    else:
                        kk, cc = 32 + ((d0 >> 2) & 3), d0 >> 4
                    col = (kk & 3) * 16 + 2 * cc
                    lo, hi = (col + 8, col) if mut == "q_pairs_swapped" else (col, col + 8)
                    for i, c in enumerate((lo, lo + 1, hi, hi + 1)):
                        addr = (kk >> 2) * qslab + swz128(n, c)
                        assert addr not in tile, "Q tile element written twice"
                        tile[addr] = v[i]
    return tile, 2.0 ** e


def convert_q8(q, m, mut):
    """FLASHMLA_FP8_Q=1: q float64 [NR, 576] -> (tile {byte address: value}, 2^e per row): each live row's NoPE part
    scaled by 2^-e (e = E - 8, or E - 7 when max |row| = m 2^E has m > 1.75) and rounded to e4m3 (the value kept in
    scaled units), its 4-byte groups at k-step 4tl + 2hf + p, bytes 16x + 4cq.. of that k-step; RoPE as convert_q."""
    nr = q.shape[0]
    qslab = nr * 128
    qs = np.ones(nr)
    for n in range(m):
        mant, ex = math.frexp(max(abs(q[n, d]) for d in range(512)))
        if mant > 0:
            qs[n] = 2.0 ** min(max(ex - 9 + (2 * mant > 1.75), -100), 100)
    if mut == "q8_row_scale_of_row0":
        qs[:] = qs[0]
    live = np.arange(nr)[:, None] < m
    q8 = torch.from_numpy(np.where(live, q[:, :512] / qs[:, None], 0.0)).to(torch.float8_e4m3fn).double().numpy()
    tile = {}
    for t in range(128):
        for hh in range(nr // 16):
            n, ch = (t >> 3) + 16 * hh, t & 7
            for sl in range(9):
                for h in range(2):
                    d = 64 * sl + 8 * ch + 4 * h
                    if sl < 8:
                        r = d & 127
                        x16, p8 = ((r >> 3) & 1, (r >> 2) & 1) if mut == "q8_halves_swapped" else ((r >> 2) & 1, (r >> 3) & 1)
                        col = ((r >> 4) & 1) * 64 + p8 * 32 + x16 * 16 + (r >> 5) * 4
                        for j in range(4):
                            c = col + j
                            addr = (sl >> 1) * qslab + swz128_byte(n, c)
                            assert addr not in tile, "Q8 tile byte written twice"
                            tile[addr] = q8[n, d + j]
                    else:
                        d0 = 8 * ch + 4 * h
                        kk, cc = 32 + ((d0 >> 2) & 3), d0 >> 4
                        col = (kk & 3) * 16 + 2 * cc
                        for i, c in enumerate((col, col + 1, col + 8, col + 9)):
                            tile[(kk >> 2) * qslab + swz128(n, c)] = q[n, 512 + d0 + i] if n < m else 0.0
    return tile, qs


def b_operand8(tile, nr):
    """The e4m3 K-major B operand of S's NoPE part: [NR rows][16 k-steps x 32] (scaled units)."""
    qslab = nr * 128

    def byte(n, kk, k):
        return tile[(kk >> 2) * qslab + swz128_byte(n, (kk & 3) * 32 + k)]
    return np.array([[byte(n, kk, k) for kk in range(16) for k in range(32)] for n in range(nr)])


def s_fragment_keys():
    """(key, cq) for each of a thread's two rows of S^T's A fragments: warp w4, lane (gq, cq) holds keys 16 w4 + gq
    and 16 w4 + gq + 8."""
    for t in range(128):
        w4, lane = t >> 5, t & 31
        gq, cq = lane >> 2, lane & 3
        yield 16 * w4 + gq, cq
        yield 16 * w4 + gq + 8, cq


def k_fragments8(raw):
    """FLASHMLA_FP8_Q=1: e4m3 A fragments of S^T's NoPE part (m64nNRk32) -> logical A [64 keys][16 x 32]: bytes
    [32cq + 16hf, +16) of a key's tile tl are k-steps 4tl + 2hf + p, word 2p at k = 4cq.., word 2p + 1 at 16 + 4cq.."""
    a = np.full((64, 512), np.nan)
    for key, cq in s_fragment_keys():
        for tl in range(4):
            for hf in range(2):
                b = raw[key, 128 * tl + 32 * cq + 16 * hf:][:16]
                for p in range(2):
                    kk = 4 * tl + 2 * hf + p
                    for j in range(4):
                        for k, byte in ((4 * cq + j, b[8 * p + j]), (16 + 4 * cq + j, b[8 * p + 4 + j])):
                            assert np.isnan(a[key, 32 * kk + k]), "K8 fragment element written twice"
                            a[key, 32 * kk + k] = E4M3[byte]
    return a


def b_operand(tile, nr):
    """The K-major B operand as the wgmma reads it: [NR rows][36 k-steps x 16]."""
    return np.array([[tile[(kk >> 2) * nr * 128 + swz128(n, (kk & 3) * 16 + k)] for kk in range(36) for k in range(16)]
                     for n in range(nr)])


def k_fragments(raw, mut):
    """A fragments of S^T per thread -> logical A [64 keys][36 x 16] (NoPE as e4m3 values, RoPE as bf16)."""
    a = np.zeros((64, 576))
    seen = np.zeros((64, 576), dtype=bool)
    rope = torch.from_numpy(raw[:, 528:].copy()).view(torch.bfloat16).double().numpy()  # [64, 64]

    def put(key, kcol, v):
        assert not seen[key, kcol], "K fragment element written twice"
        seen[key, kcol] = True
        a[key, kcol] = v
    for key, cq in s_fragment_keys():
        for tl in range(4):
            for hf in range(2):
                for q in range(4):
                    off = 128 * tl + 32 * cq + 16 * hf + 4 * q
                    kk = 8 * tl + 4 * hf + q
                    b = raw[key, off:off + 4]
                    for e in range(2):
                        put(key, 16 * kk + 2 * cq + e, E4M3[b[e]])
                        put(key, 16 * kk + 2 * cq + 8 + e, E4M3[b[2 + e]])
        for hf in range(2):  # RoPE words 2j (k 2c, 2c + 1) and 2j + 1 (k 2c + 8, 2c + 9) of k-step 32 + j
            for i in range(4):
                j, word = 2 * hf + i // 2, i % 2
                r0 = 16 * cq + 8 * hf + 4 * (i // 2) + 2 * word  # the two RoPE columns of this word
                for e in range(2):
                    put(key, 16 * (32 + j) + 2 * cq + 8 * word + e, rope[key, r0 + e])
    assert seen.all(), "a K fragment element never written"
    return a


def v_fragments(raw, valid, mut):
    """A fragments of O^T per thread (f16 products, scale / sigma) -> ({value column: [64 keys]}, sigma per tile)."""
    col, seen = {}, set()
    scales = raw[:, 512:528].copy().view(np.float32).astype(np.float64)  # [64, 4]
    sig = {}
    for w4 in range(4):
        live = [scales[k, w4] for k in range(64) if k < valid or mut == "v_tail_scale_kept"]
        sig[w4] = pow2_ceil(max(live, default=0.0))
    sel_lo, sel_hi = (0x5410, 0x7632) if mut == "prmt_selectors" else (0x5140, 0x7362)
    for t in range(128):
        w4, lane = t >> 5, t & 31
        gq, cq = lane >> 2, lane & 3
        d0 = 128 * w4 + 16 * gq
        for ks in range(4):
            keys = [16 * ks + 2 * cq + (u & 1) + 8 * (u >> 1) for u in range(4)]
            dead = [k >= valid for k in keys]
            fac = [0.0 if dead[u] and mut != "v_tail_scale_kept" else scales[keys[u], w4] / sig[w4] for u in range(4)]
            for p2 in range(2):
                ka, kb = keys[2 * p2], keys[2 * p2 + 1]
                fa, fb = f16(fac[2 * p2]), f16(fac[2 * p2 + 1])
                for q in range(4):
                    wa = [0] * 4 if dead[2 * p2] else list(raw[ka, d0 + 4 * q:d0 + 4 * q + 4])
                    wb = [0] * 4 if dead[2 * p2 + 1] else list(raw[kb, d0 + 4 * q:d0 + 4 * q + 4])
                    src = wa + wb
                    for sel, mt in ((sel_lo, 2 * q), (sel_hi, 2 * q + 1)):
                        by = [src[(sel >> (4 * i)) & 7] for i in range(4)]  # PRMT: result byte i <- source nibble i
                        for half, h in ((0, 0), (1, 1)):  # low 16 bits: row gq (h 0), high: row gq + 8 (h 1)
                            dcol = d0 + 2 * mt + (1 - h if mut == "v_rows_swapped" else h)
                            v = col.setdefault(dcol, np.zeros(64))
                            for e, (k, f) in enumerate(((ka, fa), (kb, fb))):
                                assert (dcol, k) not in seen, "V fragment element written twice"
                                seen.add((dcol, k))
                                v[k] = f16(E4M3[by[2 * half + e]] * f)
    assert len(seen) == 512 * 64, "a V fragment element never written"
    return col, sig


def pv8_operands(pt, fac, nr, mut):
    """FLASHMLA_FP8_PV=1: WG0's 16-bit stores of e4m3(p * scale / sigma) into the two planes of a parity (thread (w4, gq,
    cq): keys 16 w4 + gq + 8 o, o = 0 / 1 the low / high byte at 64 (tl & 1) + 16 w4 + 2 gq of tile tl's plane tl >> 1),
    read back as the B operand of tile tl and k-step ks: bytes 64 (tl & 1) + 32 ks.. of each row -> b[tl][ks] [32 k, NR]."""
    planes, seen = np.full((2, nr * 128), np.nan), set()
    for w4, gq, cq, k, tl, o in np.ndindex(4, 8, 4, nr // 4, 4, 2):
        key, n = 16 * w4 + gq + 8 * o, rf_col(k, cq)
        byte = 64 * (tl & 1) + 16 * w4 + 2 * gq + ((1 - o) if mut == "pv8_pair_swapped" else o)
        if mut == "pv8_planes_swapped": tl ^= 1
        addr = swz128_byte(n, byte)
        assert (tl >> 1, addr) not in seen, "P^T byte written twice"
        seen.add((tl >> 1, addr))
        planes[tl >> 1, addr] = e4m3_rn(pt[key, n] * fac[key, tl])
    assert len(seen) == 2 * nr * 128, "a P^T byte never written"
    return [[np.array([[planes[tl >> 1, swz128_byte(n, 64 * (tl & 1) + 32 * ks + kk)] for n in range(nr)]
                       for kk in range(32)]) for ks in range(2)] for tl in range(4)]


def v_fragments8(raw, valid, mut):
    """FLASHMLA_FP8_PV=1: WG1's e4m3 A fragments of V, a[ks][mt] [64 rows, 32 k] (e4m3 values, 0 past the length), and
    the value column of each (m-tile, row)."""
    a, col, seen = np.zeros((2, 8, 64, 32)), {}, set()
    for t, ks, tl, h in np.ndindex(128, 2, 4, 2):
        w4, gq, cq = t >> 5, (t & 31) >> 2, t & 3
        c0 = 128 * tl + 4 * (8 * w4 + gq)
        x = []
        for i in range(4):  # byte i of the fragment word: key 32 ks + 8 (2h + o) + 2 cq + e, i = 2e + o
            key = 32 * ks + 8 * (2 * h + (i & 1)) + 2 * cq + (i >> 1)
            if mut == "pv8_v_key_order": key = 32 * ks + 8 * (2 * h + (i >> 1)) + 2 * cq + (i & 1)
            x.append([0] * 4 if key >= valid else list(raw[key, c0:c0 + 4]))
        t0, t1 = prmt(x[0], x[1], 0x5140), prmt(x[0], x[1], 0x7362)
        t2, t3 = prmt(x[2], x[3], 0x5140), prmt(x[2], x[3], 0x7362)
        for j, reg, by in ((0, 2 * h, prmt(t0, t2, 0x5410)), (0, 2 * h + 1, prmt(t0, t2, 0x7632)),
                           (1, 2 * h, prmt(t1, t3, 0x5410)), (1, 2 * h + 1, prmt(t1, t3, 0x7632))):
            mt, row = 2 * tl + j, 16 * w4 + gq + 8 * (reg & 1)  # registers 0 / 2: row gq, 1 / 3: row gq + 8
            dcol = c0 + 2 * j + (reg & 1)
            assert col.setdefault((mt, row), dcol) == dcol, "an m-tile row of two value columns"
            for bi in range(4):
                kk = 16 * (reg >> 1) + 4 * cq + bi
                assert (ks, mt, row, kk) not in seen, "V fragment element written twice"
                seen.add((ks, mt, row, kk))
                a[ks, mt, row, kk] = E4M3[by[bi]]
    assert len(seen) == 2 * 8 * 64 * 32 and sorted(col.values()) == list(range(512)), "V fragments not covered once"
    return a, col


def rf_attention(raw_pages, L, q, m, scale, min_keys, mut=None, q8=False, pv8=False):
    """One request through the kernel's maps (P hi / lo below min_keys keys; q8: FLASHMLA_FP8_Q=1; pv8:
    FLASHMLA_FP8_PV=1, 16 rows): (out [m, 512], lse [m]) in float64."""
    nr = q.shape[0]
    if q8:
        tile, qmul = convert_q8(q, m, mut)
        bq8 = b_operand8(tile, nr)
        bq = np.zeros((nr, 576))
        bq[:, 512:] = [[tile[8 * nr * 128 + swz128(n, (kk & 3) * 16 + k)] for kk in range(32, 36) for k in range(16)]
                       for n in range(nr)]
    else:
        tile, qmul = convert_q(q, m, mut)
        bq = b_operand(tile, nr)
    mrow, lrow = np.full(nr, -np.inf), np.zeros(nr)
    o = np.zeros((512, nr))
    sig_prev = {w: 0.0 for w in range(4)}
    lo = L < min_keys
    pv8 = pv8 and not lo and nr == 16
    for p, raw in enumerate(raw_pages):
        valid = L - 64 * p
        a = k_fragments(raw, mut)
        sc = raw[:, 512:528].copy().view(np.float32).astype(np.float64)
        if q8:  # (the kernel's S_t also scaled by 2^e per query row, below)
            a8 = k_fragments8(raw)
            st = [a8[:, 128 * t:128 * t + 128] @ bq8[:, 128 * t:128 * t + 128].T for t in range(4)]
        else:
            st = [a[:, 128 * t:128 * t + 128] @ bq[:, 128 * t:128 * t + 128].T for t in range(4)]  # [64 keys, 16]
        sr = a[:, 512:] @ bq[:, 512:].T
        tl = [(t + 1) % 4 if mut == "k_tile_scales_shifted" else t for t in range(4)]
        with np.errstate(invalid="ignore"):
            s = sum(st[t] * sc[:, tl[t]:tl[t] + 1] for t in range(4)) * qmul + sr
        s = np.where(np.arange(64)[:, None] < valid, s * scale * math.log2(math.e), -np.inf)
        mx = np.where(s.max(0) > mrow + MAX_SLACK, s.max(0), mrow)
        muse = np.where(mx == -np.inf, 0.0, mx)
        al = np.exp2(mrow - muse)
        pt = np.exp2(s - (np.maximum(muse, s.max(0)) if mut == "p_from_page_max" else muse))  # [64, NR]
        assert pt.max(initial=0.0) <= 2.0 ** MAX_SLACK, "P past 2^slack (f16 P and O^T's range)"
        hi = f16(pt)
        pv = hi + (f16(pt - hi) if lo else 0.0)
        lrow = lrow * al + pt.sum(0)
        mrow = mx
        if pv8:
            live = np.arange(64)[:, None] < valid
            scl = np.where(live, sc, 0.0)
            sig = {t: pow2_ceil(scl[:, t].max()) for t in range(4)}
            fac = scl / np.array([sig[t] for t in range(4)])[None, :]
            b8 = pv8_operands(pt, fac, nr, mut)
            a8, vcol8 = v_fragments8(raw, valid, mut)
            page = np.zeros((512, nr))
            for mt, row in np.ndindex(8, 64):
                page[vcol8[(mt, row)]] = sum(a8[ks, mt, row] @ b8[mt >> 1][ks] for ks in range(2))
            v8 = np.where(live, np.array([[E4M3[b] for b in r[:512]] for r in raw]), 0.0)  # [64 keys, 512]
            direct = np.stack([v8[:, c] @ e4m3_rn(pt * fac[:, c // 128:c // 128 + 1]) for c in range(512)])
            assert np.allclose(page, direct, rtol=1e-12, atol=1e-300), "e4m3 P^T V through the maps != applied directly"
            for w4 in range(4):
                rho = sig_prev[w4] / sig[w4] if sig_prev[w4] > 0 else 1.0
                rows = slice(128 * w4, 128 * w4 + 128)
                o[rows] = o[rows] * al[None, :] * rho + page[rows]
                sig_prev[w4] = sig[w4]
            continue
        vcol, sig = v_fragments(raw, valid, mut)
        for w4 in range(4):
            rho = sig_prev[w4] / sig[w4] if sig_prev[w4] > 0 and mut != "no_sigma_rescale" else 1.0
            rows = slice(128 * w4, 128 * w4 + 128)
            o[rows] = o[rows] * al[None, :] * rho
            sig_prev[w4] = sig[w4]
        assert sorted(vcol) == list(range(512)), "value columns not covered exactly once"
        for dcol, v in vcol.items():
            o[dcol] += v @ pv
    out = np.zeros((512, nr))
    for w4 in range(4):
        rows = slice(128 * w4, 128 * w4 + 128)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[rows] = o[rows] * sig_prev[w4] * np.where(lrow > 0, 1.0 / lrow, 0.0)[None, :]
    with np.errstate(divide="ignore"):
        lse = np.where(lrow > 0, (mrow + np.log2(lrow)) * math.log(2), np.inf)
    return out.T[:m], lse[:m]


def check_layout(L, m, seed, wide=False, min_keys=1024, nr=16, ramp=False, mut=None, q8=False, pv8=False):
    g = torch.Generator().manual_seed(seed)
    npg = (L + 63) // 64
    kc = torch.randn(npg * 64, 576, generator=g).to(torch.bfloat16)
    if wide:  # tile scales over 5 decades: sigma differs between pages and tiles
        mag = torch.pow(10.0, torch.rand(npg * 64, 4, generator=g) * 5 - 4.5)
        kc = torch.cat([(kc[:, :512].float().view(-1, 4, 128) * mag[..., None]).flatten(1), kc[:, 512:].float()], 1)
        kc = kc.to(torch.bfloat16)
    if ramp:  # logits growing page by page: each page's max above the reference by more than the slack
        kc = (kc.float() * (1 + 3 * torch.arange(npg * 64) // 64)[:, None]).to(torch.bfloat16)
    k8 = quantize_kvcache(kc)
    k8[L:] = 0xFF  # NaN values and scales past the length
    q = torch.randn(nr, 576, generator=g).to(torch.bfloat16).double()
    q[m:] *= 50.0  # the next request's rows: must not set E
    if q8:  # rows of different magnitudes: different 2^e
        q = (q * torch.pow(2.0, torch.arange(nr) % 5 - 2.0)[:, None]).to(torch.bfloat16).double()
    scale = 576 ** -0.5
    raw = k8.numpy()
    out, lse = rf_attention([raw[64 * p:64 * p + 64] for p in range(npg)], L, q.numpy(), m, scale, min_keys, mut, q8, pv8)
    kd = dequantize_kvcache(k8[:L], torch.float32).double()
    logits = (fp8_query(q[:m]).double() if q8 else q[:m]) @ kd.T * scale
    ref_lse = torch.logsumexp(logits, -1)
    ref = torch.softmax(logits, -1) @ kd[:, :512]
    assert np.isfinite(out).all(), "non-finite output"
    err = np.abs(out - ref.numpy()).max() / max(1e-30, np.abs(ref.numpy()).max())
    assert err < (0.1 if pv8 and L >= min_keys else 2e-3), f"out error {err:.2e} (L={L}, m={m})"
    lerr = np.abs(lse - ref_lse.numpy()).max()
    assert lerr < 1e-4, f"lse error {lerr:.2e}"


# (keys, rows, seed[, wide scales, exact-P threshold, NR]): tails of 36, 1 and 2 keys, a page-aligned length, bf16-only
# P; 17..32 rows in the NR = 32 tile; a request whose max rises page after page (a reference max moved and kept)
LAYOUT_CASES = [(100, 16, 1), (1, 5, 2), (64, 11, 3), (130, 16, 4, True), (70, 3, 5, False, 0),
                (300, 9, 9, False, 1024, 16, True), (150, 32, 6, False, 1024, 32), (65, 17, 7, True, 1024, 32),
                (400, 24, 8, False, 0, 32, True)]
# FLASHMLA_FP8_Q=1: both tiles, a tail, hi / lo P
Q8_CASES = [(100, 16, 11), (130, 7, 12, True), (65, 32, 13, False, 1024, 32), (200, 20, 14, True, 0, 32)]
Q8_MUTANTS = ("q8_halves_swapped", "q8_row_scale_of_row0", "k_tile_scales_shifted")
# FLASHMLA_FP8_PV=1 (16 rows; min_keys 0: every request in e4m3 P^T): tails, wide scales (sigma per page and tile), a
# rising max, with FP8_Q too
PV8_CASES = [(100, 16, 21, False, 0), (130, 7, 22, True, 0), (1, 3, 23, False, 0), (300, 9, 24, False, 0, 16, True)]
PV8_MUTANTS = ("pv8_pair_swapped", "pv8_planes_swapped", "pv8_v_key_order")
LAYOUT_MUTANTS = ("q_pairs_swapped", "prmt_selectors", "v_rows_swapped", "k_tile_scales_shifted", "no_sigma_rescale",
                  "v_tail_scale_kept", "p_from_page_max")


# ------------------------------------------------------------------------------- protocol
def run_protocol(reqs, seed, nr, mut=None):
    """reqs: pages per request (0 allowed); nr: the instantiation (16 or 32 rows)."""
    rnd = random.Random(seed)
    mb = {**{f"rf{s}": MBar(1) for s in range(SLOTS)},
          **{f"re{s}": MBar(128 if mut == "raw_empty_count_128" else 256) for s in range(SLOTS)},
          **{f"pf{s}": MBar(128) for s in range(2)}, **{f"pe{s}": MBar(128) for s in range(2)}}
    nb = {k: NBar(k, parties=4) for k in ("SMAX", "SL", "Q")}

    def producer():  # (Q: an L2 prefetch only, no shared memory)
        it = 0
        for r, npg in enumerate(reqs):
            for j in range(npg):
                s = it % SLOTS
                yield ("wait", f"re{s}", ((it // SLOTS) & 1) ^ 1)
                yield ("expect", f"rf{s}"); yield ("tma", f"R{s}", ("pg", it), f"rf{s}")
                it += 1

    def s_warp(w):
        it = rq = 0
        for r, npg in enumerate(reqs):
            if npg == 0: continue
            yield ("write", f"QR.{w}", ("QR", r)); yield ("nsync", "Q")  # Q's max (from global memory)
            for x in range(4): yield ("rbeg", f"QR.{x}", ("QR", r)); yield ("rend", f"QR.{x}", ("QR", r))
            yield ("write", f"QF.{w}", ("QF", r))
            if mut != "q_tile_unsynced": yield ("nsync", "Q")
            for j in range(npg):
                s, par = it % SLOTS, it & 1
                yield ("wait", f"rf{s}", (it // SLOTS) & 1)
                rd = [(f"R{s}", ("pg", it))] + [(f"QF.{x}", ("QF", r)) for x in range(4)]
                for b, v in rd: yield ("rbeg", b, v)
                for b, v in rd: yield ("rend", b, v)
                yield ("arrive", f"re{s}", 32)
                mpar = 0 if mut == "smax_one_buffer" else par
                yield ("write", f"M{mpar}.{w}", ("M", it)); yield ("nsync", "SMAX")
                for x in range(4): yield ("rbeg", f"M{mpar}.{x}", ("M", it)); yield ("rend", f"M{mpar}.{x}", ("M", it))
                ppar = 0 if mut == "one_p_plane" else par
                if mut != "s_skips_p_empty": yield ("wait", f"pe{par}", ((it >> 1) & 1) ^ 1)
                yield ("write", f"P{ppar}.{w}", ("P", it))
                if w == 0: yield ("write", f"A{ppar}", ("A", it))
                if j == npg - 1:
                    lpar = rq & 1
                    yield ("write", f"L{lpar}.{w}", ("L", r)); yield ("nsync", "SL")
                    for x in range(4): yield ("rbeg", f"L{lpar}.{x}", ("L", r)); yield ("rend", f"L{lpar}.{x}", ("L", r))
                    ipar = 0 if mut == "one_inv_buffer" else rq & 1
                    if w == 0: yield ("write", f"I{ipar}", ("I", r))
                yield ("arrive", f"pf{par}", 32)
                it += 1
            rq += 1

    def v_warp(w):
        it = rq = 0
        for r, npg in enumerate(reqs):
            for j in range(npg):
                s, par = it % SLOTS, it & 1
                yield ("wait", f"rf{s}", (it // SLOTS) & 1)
                if mut == "v_releases_before_read": yield ("arrive", f"re{s}", 32)
                yield ("rbeg", f"R{s}", ("pg", it)); yield ("rend", f"R{s}", ("pg", it))
                if mut != "v_releases_before_read" and nr == 16: yield ("arrive", f"re{s}", 32)
                yield ("wait", f"pf{par}", (it >> 1) & 1)
                ppar = 0 if mut == "one_p_plane" else par
                ipar = 0 if mut == "one_inv_buffer" else rq & 1
                rd = [(f"P{ppar}.{x}", ("P", it)) for x in range(4)] + [(f"A{ppar}", ("A", it))]
                if j == npg - 1 and mut != "v_reads_inv_late": rd.append((f"I{ipar}", ("I", r)))
                for b, v in rd: yield ("rbeg", b, v)
                if nr == 32:  # batches 2..7 of V read while P^T's wgmmas run; the slot released after the last
                    if mut == "v32_releases_before_rest": yield ("arrive", f"re{s}", 32)
                    yield ("rbeg", f"R{s}", ("pg", it)); yield ("rend", f"R{s}", ("pg", it))
                    if mut not in ("v_releases_before_read", "v32_releases_before_rest"): yield ("arrive", f"re{s}", 32)
                for b, v in rd: yield ("rend", b, v)
                yield ("arrive", f"pe{par}", 32)
                if j == npg - 1 and mut == "v_reads_inv_late":
                    yield ("rbeg", f"I{ipar}", ("I", r)); yield ("rend", f"I{ipar}", ("I", r))
                it += 1
            rq += npg > 0

    actors = {"PR": producer(), **{f"S{w}": s_warp(w) for w in range(4)}, **{f"V{w}": v_warp(w) for w in range(4)}}
    simulate(actors, mb, nb, rnd, slow=0.03, max_steps=400000)


def check_protocol(trials, mut=None):
    n = 0
    for reqs, seed in page_mixes(trials, [0, 1, 1, 1, 2, 3, 6]):
        for nr in (16, 32):
            run_protocol(reqs, seed, nr, mut); n += 1
    return n


PROTOCOL_MUTANTS = ("raw_empty_count_128", "v_releases_before_read", "s_skips_p_empty", "one_p_plane", "one_inv_buffer",
                    "v_reads_inv_late", "q_tile_unsynced", "v32_releases_before_rest")
# (sMax by page parity is belt and braces, as in the other swap-AB kernel: "smax_one_buffer" passes)


def main(argv):
    trials = int(argv[argv.index("--trials") + 1]) if "--trials" in argv else 300
    for case in LAYOUT_CASES:
        check_layout(*case)
    for case in Q8_CASES:
        check_layout(*case, q8=True)
    for case, q8 in itertools.product(PV8_CASES, (False, True)):
        check_layout(*case, q8=q8, pv8=True)
    print("swapab_rf layout model: Q conversion and permutation, K and V fragments, per-tile scales, sigma, softmax, "
          "epilogue, FP8_Q's e4m3 Q and K fragments, FP8_PV's e4m3 P^T planes and V fragments == attention on "
          "dequantize_kvcache(k, float32)")
    print("swapab_rf protocol model ok:", check_protocol(trials), "random schedules, no deadlock, no race")
    if "--mutants" in argv:
        expect_caught(lambda mut: [check_layout(*c, mut=mut) for c in LAYOUT_CASES], LAYOUT_MUTANTS)
        expect_caught(lambda mut: [check_layout(*c, mut=mut, q8=True) for c in Q8_CASES], Q8_MUTANTS)
        expect_caught(lambda mut: [check_layout(*c, mut=mut, pv8=True) for c in PV8_CASES], PV8_MUTANTS)
        expect_caught(lambda mut: check_protocol(trials, mut), PROTOCOL_MUTANTS)
        print("all", len(LAYOUT_MUTANTS) + len(Q8_MUTANTS) + len(PV8_MUTANTS) + len(PROTOCOL_MUTANTS), "mutants caught")


if __name__ == "__main__":
    main(sys.argv)
