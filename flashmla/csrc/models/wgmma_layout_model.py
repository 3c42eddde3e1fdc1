"""Numpy model of the wgmma kernel's shared-memory layouts (mirrors ../mla_decode_wgmma.cu, ../wgmma_common.cuh).

TMA 128B-swizzle placement of the Q tile and a K page (address bits 4-6 ^= bits 7-9), wgmma operand
fetch through the kernel's own descriptor arithmetic read back with the PTX ISA's canonical layouts
(K-major ((8,m),(T,2k)):((8T,SBO),(1,T)); MN-major ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))), the
accumulator fragment map, the P stores, the epilogue map and the zeroing loop. Checks S = Q K^T and
both halves of O = P V against direct products. It checks the kernel's index arithmetic against the
documented layouts, not the hardware. ~5 s:

    python flashmla/csrc/models/wgmma_layout_model.py
"""
import numpy as np
SLAB, TILE = 8192, 9 * 8192
OFF_Q, OFF_K = 0, TILE
OFF_PLO = OFF_K + 2 * TILE
smem = np.full((OFF_PLO + SLAB + 4096) // 2, np.nan)
def swz(addr): return addr ^ (((addr >> 7) & 7) << 4)
def tma_tile(base, X):  # X [64 rows, 576], boxes of 64 columns -> 9 slabs
    for j in range(9):
        for r in range(64):
            for c in range(64):
                smem[swz(base + j * SLAB + r * 128 + c * 2) // 2] = X[r, j * 64 + c]
def desc_k(addr): return ((addr & 0x3FFFF) >> 4) | (1 << 16) | (64 << 32) | (1 << 62)
def desc_mn(addr): return ((addr & 0x3FFFF) >> 4) | ((SLAB >> 4) << 16) | (64 << 32) | (1 << 62)
def decode(d): return (d & 0x3FFF) << 4, ((d >> 16) & 0x3FFF) << 4, ((d >> 32) & 0x3FFF) << 4, d >> 62
def fetch_kmajor(d, rows):  # returns [rows, 16] (MN x K), K-major SW128, T = 8
    start, lbo, sbo, lay = decode(d); assert lay == 1
    out = np.empty((rows, 16))
    for i in range(rows):
        for j in range(16):
            e = (i % 8) * 64 + (i // 8) * (sbo // 2) + (j % 8) + (j // 8) * 8
            out[i, j] = smem[swz(start + 2 * e) // 2]
    return out
def fetch_mnmajor(d, n):  # returns [16, n] (K x N), MN-major SW128
    start, lbo, sbo, lay = decode(d); assert lay == 1
    out = np.empty((16, n))
    for j in range(16):
        for c in range(n):
            e = (c % 8) + ((c // 8) % 8) * 8 + (c // 64) * (lbo // 2) + (j % 8) * 64 + (j // 8) * (sbo // 2)
            out[j, c] = smem[swz(start + 2 * e) // 2]
    return out
def frag_rows_cols(t, n):  # accumulator fragment of thread t for an m64nN tile: list of (reg, row, col)
    w, lane = t // 32, t % 32
    res = []
    for i in range(n // 8):
        for e in range(4):
            res.append((i * 4 + e, 16 * w + lane // 4 + 8 * (e >> 1), 8 * i + 2 * (lane % 4) + (e & 1)))
    return res
def swz128(r, k): return r * 128 + ((((k >> 3) ^ r) & 7) << 4) + (k & 7) * 2

rng = np.random.default_rng(0)
Q = rng.standard_normal((64, 576)); K = rng.standard_normal((64, 576))
s = 1
uQ, uKs = OFF_Q, OFF_K + s * TILE
tma_tile(uQ, Q); tma_tile(uKs, K)
# S with the kernel's descriptor arithmetic (descriptor + offset >> 4)
S = np.zeros((64, 64)); dq, dk = desc_k(uQ), desc_k(uKs)
for kk in range(36):
    off = ((kk >> 2) * SLAB + (kk & 3) * 32) >> 4
    S += fetch_kmajor(dq + off, 64) @ fetch_kmajor(dk + off, 64).T
assert np.allclose(S, Q @ K.T), "S mismatch"
# accumulator -> registers -> P stores (hi plane only; lo identical layout)
P = rng.random((64, 64))
uPhi = uKs + 8 * SLAB
for t in range(128):
    for reg, r, c in frag_rows_cols(t, 64):
        if c % 2 == 0:  # the pair (c, c+1) is one 32-bit store at swz128(r, c)
            a = uPhi + swz128(r, c)
            smem[a // 2] = P[r, c]; smem[a // 2 + 1] = P[r, c + 1]
# PV for both warpgroups
for ch in range(2):
    O = np.zeros((64, 256)); dv, dhi = desc_mn(uKs + ch * 4 * SLAB), desc_k(uPhi)
    for ks in range(4):
        O += fetch_kmajor(dhi + ks * 2, 64) @ fetch_mnmajor(dv + ks * 128, 256)
    assert np.allclose(O, P @ K[:, ch * 256:(ch + 1) * 256]), f"O mismatch ch={ch}"
    # epilogue mapping: thread t register j*4+e -> (row, column ch*256 + j*8 + 2cq + (e&1))
    got = np.empty((64, 256))
    for t in range(128):
        for reg, r, c in frag_rows_cols(t, 256): got[r, c] = O[r, c]
    assert not np.isnan(got).any()
# zeroing rows >= valid in slabs 0..7 by the kernel's loop covers exactly those rows
valid = 37; hit = set()
for t in range(128):
    for idx in range(t, 8 * 64 * 8, 128):
        r = (idx >> 3) & 63
        if r >= valid: hit.add((idx >> 9, r, idx & 7))
assert hit == {(sl, r, c) for sl in range(8) for r in range(valid, 64) for c in range(8)}
print("layout model: S, O (both halves), P stores, epilogue map, zeroing: consistent")
