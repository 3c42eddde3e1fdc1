"""Model of the FP8 wgmma kernel's page staging (mirrors the producer of ../mla_decode_wgmma_fp8.cu).

For one page of the FP8 cache (bytes from flashmla.quantize_kvcache, token rows past `valid`
overwritten with 0xFF: NaN values and NaN scales) it replays, on the stage's bytes:
  - the raw TMA of box 1: an unswizzled box of NoPE bytes 256..511 x 64 tokens at slab 6 (box 0,
    bytes 0..255, each thread reads from the page in global memory);
  - the dequantising threads: thread -> (chunk cb, first token r0) map, tokens r0 + 8i, a 16-byte
    raw read, fp8 -> f32 times the fp32 scale 2 bx + cb / 8 -> bf16, two 16-byte stores at the
    kernel's swizzled offsets (rows past `valid` stored as zeros); box 0 read and stored thread by
    thread, box 1 read by every thread, then (warpgroup barrier) stored;
  - the RoPE TMA: tensor map over rows of 328 bf16 (656 bytes), 64 x 64 box at column ROPE_COL,
    128B swizzle (address bits 4-6 ^= bits 7-9) into slab 8;
and checks: every 16-byte unit of slabs 0..7 stored exactly once; each quarter warp's stores hit 8
distinct units of the 128-byte bank window, and so do its box-1 raw reads (no bank conflict); the stage read back through the
consumers' wgmma descriptors (K-major for S, MN-major for V, as in wgmma_layout_model.py) equals
flashmla.dequantize_kvcache of the page (V rows past `valid` exactly 0), which also shows that no
store overwrote raw bytes before they were read; S = Q K^T. `--mutants` breaks one offset or order at
a time and asserts each is caught. ~2 s:

    python flashmla/csrc/models/wgmma_fp8_layout_model.py [--mutants]
"""
import sys

import numpy as np
import torch

from flashmla.quant import dequantize_kvcache, quantize_kvcache

SLAB, TILE, TOKEN = 8192, 9 * 8192, 656


def swz(addr): return addr ^ (((addr >> 7) & 7) << 4)


def producer_map(t, mut):
    """(r0, cb, sw0, sw1) of producer thread t, as in the kernel."""
    lane, w4 = t & 31, t >> 5
    r0 = w4 + 4 * ((lane >> 2) & 1) if mut == "tokens_4_apart" else 2 * w4 + ((lane >> 2) & 1)
    half = (lane >> 2) & 1  # token r0 (even lanes of a quarter) or r0 + 1
    cb = (lane >> 3) * 4 + (lane & 3) if mut == "same_chunks_both_tokens" else ((lane >> 3) * 4 + (lane & 3) + 4 * half) & 15
    unit = (cb & 3) * 2
    if mut == "swizzle_without_row":
        return r0, cb, unit << 4, (unit + 1) << 4
    return r0, cb, ((unit ^ r0) & 7) << 4, (((unit + 1) ^ r0) & 7) << 4


def raw1_slab(mut):  # where box 1's raw bytes land
    return 2 if mut == "raw_over_slabs_2_3" else 6


def to_bf16_bytes(vals):
    with np.errstate(invalid="ignore"):
        return torch.from_numpy(vals).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint8)


def stage_page(raw, valid, mut=None):
    """raw: uint8 [64, 656]. Returns the 9-slab stage as float64 [TILE // 2] (slabs 0-7 NaN where never stored)."""
    stage = np.zeros(TILE, dtype=np.uint8)
    base = raw1_slab(mut) * SLAB  # raw TMA of box 1: columns 256 .. 511 of the 64 tokens, rows 256 bytes apart
    stage[base:base + 64 * 256] = raw[:, 256:512].reshape(-1)
    scales = raw[:, 512:528].copy().view(np.float32)                                        # [64, 4]
    stored = np.zeros(8 * SLAB // 16, dtype=int)
    banks, loads = {}, {}

    def read(bx, t, i):
        r0, cb, _, _ = producer_map(t, mut)
        if bx == 0:  # from the page in global memory
            return raw[r0 + 8 * i, cb * 16:cb * 16 + 16].copy()
        off = raw1_slab(mut) * SLAB + (r0 + 8 * i) * 256 + cb * 16
        loads.setdefault((bx, t >> 3, i), []).append((off % 128) // 16)
        return stage[off:off + 16].copy()

    def store(bx, t, i, chunk):
        r0, cb, sw0, sw1 = producer_map(t, mut)
        r = r0 + 8 * i
        ok = r < valid if mut != "no_tail_zero" else True
        tile = 2 * bx + (cb >> 2 & 1 if mut == "scale_index" else cb >> 3)   # 128 columns = 8 chunks per scale
        fp8 = torch.from_numpy(chunk).view(torch.float8_e4m3fn).float().numpy()               # exact
        vals = fp8.astype(np.float32) * scales[r, tile] if ok else np.zeros(16, np.float32)
        b = to_bf16_bytes(vals)
        row = (4 * bx + (cb >> 2)) * SLAB + r * 128
        for k, sw in enumerate((sw0, sw1)):
            addr = row + sw
            stage[addr:addr + 16] = b[16 * k:16 * k + 16]
            stored[addr // 16] += 1
            banks.setdefault((bx, t >> 3, i, k), []).append((addr % 128) // 16)

    for t in range(128):                        # box 0: read and store, thread after thread
        for i in range(8):
            store(0, t, i, read(0, t, i))
    if mut == "box1_unstaged":                  # (what the register staging + barrier prevent)
        for t in range(128):
            for i in range(8):
                store(1, t, i, read(1, t, i))
    else:
        staged = {(t, i): read(1, t, i) for t in range(128) for i in range(8)}
        for (t, i), chunk in staged.items():
            store(1, t, i, chunk)
    assert (stored == 1).all(), f"slab units stored {stored.min()}..{stored.max()} times (want exactly once)"
    for key, units in banks.items():
        assert len(set(units)) == 8, f"bank conflict in quarter warp {key}: units {units}"
    for key, units in loads.items():  # each quarter warp's 16-byte raw reads: 8 distinct units too
        assert len(set(units)) == 8, f"bank conflict in quarter warp {key}'s raw read: units {units}"
    smem = stage.view(np.int16).copy()
    smem = torch.from_numpy(smem).view(torch.bfloat16).double().numpy()
    rope_col = 263 if mut == "rope_col" else 264
    rope = raw.reshape(-1).view(np.uint8)
    for r in range(64):
        for c in range(64):
            off = r * TOKEN + 2 * (rope_col + c)
            v = torch.from_numpy(rope[off:off + 2].copy()).view(torch.bfloat16).double().item()
            smem[swz(8 * SLAB + r * 128 + 2 * c) // 2] = v
    return smem


def desc_fetch_kmajor(smem, start, rows):  # [rows, 16], K-major SW128, SBO = 1024
    i, j = np.meshgrid(np.arange(rows), np.arange(16), indexing="ij")
    e = (i % 8) * 64 + (i // 8) * 512 + (j % 8) + (j // 8) * 8
    return smem[swz(start + 2 * e) // 2]


def desc_fetch_mnmajor(smem, start, n):  # [16, n], MN-major SW128, LBO = SLAB, SBO = 1024
    j, c = np.meshgrid(np.arange(16), np.arange(n), indexing="ij")
    e = (c % 8) + ((c // 8) % 8) * 8 + (c // 64) * (SLAB // 2) + (j % 8) * 64 + (j // 8) * 512
    return smem[swz(start + 2 * e) // 2]


def check(valid, seed, mut=None):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(64, 576, generator=g) * torch.exp(torch.randn(64, 1, generator=g))
    raw = quantize_kvcache(k.to(torch.bfloat16)).numpy().copy()
    raw[valid:] = 0xFF                                     # NaN fp8 and NaN scales past the length
    ref = dequantize_kvcache(torch.from_numpy(raw)).double().numpy()   # [64, 576]
    smem = stage_page(raw, valid, mut)
    # S operand (kernel: descriptor + ((kk >> 2) * SLAB + (kk & 3) * 32) >> 4)
    kst = np.concatenate([desc_fetch_kmajor(smem, (kk >> 2) * SLAB + (kk & 3) * 32, 64) for kk in range(36)], axis=1)
    assert np.array_equal(kst[:valid], ref[:valid]), "S operand differs from the dequantised page"
    q = np.random.default_rng(seed).standard_normal((64, 576))
    assert np.allclose(q @ kst[:valid].T, q @ ref[:valid].T), "S = Q K^T mismatch"
    # V operand of both warpgroups (kernel: desc_mnmajor(stage + ch * 4 * SLAB) + ks * 128)
    for ch in range(2):
        v = np.concatenate([desc_fetch_mnmajor(smem, ch * 4 * SLAB + ks * 2048, 256) for ks in range(4)], axis=0)
        want = ref[:, ch * 256:(ch + 1) * 256].copy()
        want[valid:] = 0.0
        assert np.array_equal(v, want), f"V operand (half {ch}) differs (rows past {valid} must be 0)"


MUTANTS = ("same_chunks_both_tokens", "tokens_4_apart", "swizzle_without_row", "scale_index", "no_tail_zero", "rope_col", "raw_over_slabs_2_3",
           "box1_unstaged")

if __name__ == "__main__":
    for valid, seed in ((64, 0), (37, 1), (1, 2), (63, 3)):
        check(valid, seed)
    print("fp8 layout model: box 0 from global + raw TMA box 1 dequantised in place + TMA RoPE stage == dequantize_kvcache; S, V "
          "operands, tail zeroing, coverage, no store before the raw read, bank-conflict freedom: consistent")
    if "--mutants" in sys.argv:
        for mut in MUTANTS:
            try:
                check(37, 1, mut)
            except AssertionError as e:
                print(f"  mutant {mut}: caught ({str(e)[:70]})")
                continue
            raise SystemExit(f"mutant {mut} NOT caught: the model is too weak")
        print("all", len(MUTANTS), "mutants caught")
