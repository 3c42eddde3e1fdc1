"""Model of the FP8 wgmma kernel's page staging (mirrors the producer of ../mla_decode_wgmma_fp8.cu).

For one page of the FP8 cache (bytes from flashmla.quantize_kvcache, token rows past `valid`
overwritten with 0xFF: NaN values and NaN scales) it replays
  - the dequantising threads: thread -> (first token r0, chunk cc) map, 16 tokens r0 + 4i each,
    fp8 -> f32 times the tile's fp32 scale -> bf16, two 16-byte stores per token at the kernel's
    swizzled offsets (rows past `valid` stored as zeros);
  - the RoPE TMA: tensor map over rows of 328 bf16 (656 bytes), 64 x 64 box at column ROPE_COL,
    128B swizzle (address bits 4-6 ^= bits 7-9) into slab 8;
and checks: every 16-byte unit of slabs 0..7 written exactly once; each quarter warp's 16-byte
stores hit 8 distinct units of the 128-byte bank window (no bank conflict); the stage read back
through the consumers' wgmma descriptors (K-major for S, MN-major for V, as in
wgmma_layout_model.py) equals flashmla.dequantize_kvcache of the page (V rows past `valid`
exactly 0); S = Q K^T. `--mutants` breaks one offset at a time and asserts each is caught. ~2 s:

    python flashmla/csrc/models/wgmma_fp8_layout_model.py [--mutants]
"""
import sys

import numpy as np
import torch

from flashmla.quant import dequantize_kvcache, quantize_kvcache

SLAB, TILE, TOKEN = 8192, 9 * 8192, 656


def swz(addr): return addr ^ (((addr >> 7) & 7) << 4)


def producer_map(t, mut):
    """(r0, cc, sw[2][2]) of producer thread t, as in the kernel."""
    lane, w4 = t & 31, t >> 5
    r0 = (t >> 5) if mut == "r0_by_warp" else 2 * (w4 >> 1) + ((lane >> 2) & 1)
    cc = 16 * (w4 & 1) + (lane >> 3) * 4 + (lane & 3)
    unit = (cc & 3) * 2
    if mut == "swizzle_without_row":
        return r0, cc, [[unit << 4, (unit + 1) << 4]] * 2
    if mut == "swizzle_one_parity":
        return r0, cc, [[((unit ^ r0) & 7) << 4, (((unit + 1) ^ r0) & 7) << 4]] * 2
    return r0, cc, [[((unit ^ r0) & 7) << 4, (((unit + 1) ^ r0) & 7) << 4],
                    [((unit ^ (r0 + 4)) & 7) << 4, (((unit + 1) ^ (r0 + 4)) & 7) << 4]]


def stage_page(raw, valid, mut=None):
    """raw: uint8 [64, 656]. Returns the 9-slab stage as float64 [TILE // 2] (NaN = never written)."""
    smem = np.full(TILE // 2, np.nan)
    written = np.zeros(8 * SLAB // 16, dtype=int)
    fp8 = torch.from_numpy(raw[:, :512].copy()).view(torch.float8_e4m3fn).float().numpy()   # exact
    scales = raw[:, 512:528].copy().view(np.float32)                                        # [64, 4]
    banks = {}
    for t in range(128):
        r0, cc, sw = producer_map(t, mut)
        rows = (cc >> 2) * SLAB + r0 * 128
        for i in range(16):
            r = r0 + 4 * i
            ok = r < valid if mut != "no_tail_zero" else True
            tile = (cc >> 2) & 3 if mut == "scale_index" else cc >> 3    # 128 columns = 8 chunks per scale
            vals = fp8[r, 16 * cc:16 * cc + 16].astype(np.float32) * scales[r, tile] if ok \
                else np.zeros(16, np.float32)
            with np.errstate(invalid="ignore"):
                b = torch.from_numpy(vals).to(torch.bfloat16).double().numpy()
            row = rows + i * 4 * 128
            for k in range(2):
                addr = row + sw[i & 1][k]
                smem[addr // 2: addr // 2 + 8] = b[8 * k: 8 * k + 8]
                written[addr // 16] += 1
                banks.setdefault((t >> 3, i, k), []).append((addr % 128) // 16)
    assert (written == 1).all(), f"slab units written {written.min()}..{written.max()} times (want exactly once)"
    for key, units in banks.items():
        assert len(set(units)) == 8, f"bank conflict in quarter warp {key}: units {units}"
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


MUTANTS = ("r0_by_warp", "swizzle_without_row", "swizzle_one_parity", "scale_index", "no_tail_zero", "rope_col")

if __name__ == "__main__":
    for valid, seed in ((64, 0), (37, 1), (1, 2), (63, 3)):
        check(valid, seed)
    print("fp8 layout model: dequantised NoPE + TMA RoPE stage == dequantize_kvcache; S, V operands, "
          "tail zeroing, coverage, bank-conflict freedom: consistent")
    if "--mutants" in sys.argv:
        for mut in MUTANTS:
            try:
                check(37, 1, mut)
            except AssertionError as e:
                print(f"  mutant {mut}: caught ({str(e)[:70]})")
                continue
            raise SystemExit(f"mutant {mut} NOT caught: the model is too weak")
        print("all", len(MUTANTS), "mutants caught")
