"""Shared input generator, oracles and output check for tests, benchmarks and `python -m flashmla`."""
from __future__ import annotations

import os

import torch

from .ref import PAGE_SIZE


def make_inputs(batch: int, seqlens, h_q: int, s_q: int = 1, h_kv: int = 1, d: int = 576,
                dtype=torch.bfloat16, device="cpu", seed: int = 0, shuffle: bool = True,
                poison: bool = True, extra_blocks: int = 1):
    """Random q, paged k_cache, block_table, cache_seqlens for one decode step.

    seqlens: an int (all requests) or a list of ints. Pages are handed out in a random order
    (shuffle) and cache slots past each request's length are filled with NaN (poison), so a
    kernel that reads them or skips the mask fails. Random numbers are drawn on `device`.
    Returns (q, k_cache, block_table, cache_seqlens): q [batch, s_q, h_q, d],
    k_cache [num_blocks, 64, h_kv, d], block_table int32 [batch, max_blocks], cache_seqlens int32 [batch].
    """
    g = torch.Generator(device=device).manual_seed(seed)
    lens = [int(seqlens)] * batch if isinstance(seqlens, int) else [int(x) for x in seqlens]
    assert len(lens) == batch
    max_blocks = max(1, max((L + PAGE_SIZE - 1) // PAGE_SIZE for L in lens)) + extra_blocks
    num_blocks = batch * max_blocks
    perm = torch.randperm(num_blocks, generator=g, device=device) if shuffle else \
        torch.arange(num_blocks, device=device)
    block_table = perm.view(batch, max_blocks).to(torch.int32)
    k_cache = torch.randn(num_blocks, PAGE_SIZE, h_kv, d, generator=g, device=device).to(dtype)
    q = torch.randn(batch, s_q, h_q, d, generator=g, device=device).to(dtype)
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    if poison:
        k_cache[~live_slots(block_table, cache_seqlens, num_blocks)] = float("nan")
    return q, k_cache, block_table, cache_seqlens


def check_decode(out, lse, ro, rl, lse_tol=1e-5):
    """Asserts the issue's tolerances of a decode (out, lse) against its reference (ro, rl): out within 8e-4 abs +
    2e-2 rel of the fp32 reference, cosine similarity > 1 - 1e-5, lse within lse_tol = 1e-5 relative (abs floor
    lse_tol), same inf/NaN patterns."""
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    o = out.float()
    assert torch.equal(torch.isnan(o), torch.isnan(ro)) and torch.equal(torch.isinf(lse), torch.isinf(rl))
    assert torch.equal(torch.isposinf(lse), torch.isposinf(rl))
    torch.testing.assert_close(o, ro, atol=8e-4, rtol=2e-2)
    if ro.abs().sum() > 0:
        cos = torch.nn.functional.cosine_similarity(o.flatten().double(), ro.flatten().double(), dim=0)
        assert cos > 1 - 1e-5, f"cosine {cos.item()}"
    fin = torch.isfinite(rl)
    err = (lse[fin] - rl[fin]).abs() / rl[fin].abs().clamp_min(1.0)
    assert err.numel() == 0 or err.max() < lse_tol, f"lse rel err {err.max().item()}"


def live_slots(block_table: torch.Tensor, cache_seqlens: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """bool [num_blocks, 64]: the cache slots that hold one of its request's keys (a slot of a page that no
    request's table names is not live; a page named by several requests is live where any of them reaches)."""
    max_blocks = block_table.shape[1]
    tok = torch.arange(max_blocks * PAGE_SIZE, device=block_table.device).view(1, max_blocks, PAGE_SIZE)
    live = (tok < cache_seqlens.view(-1, 1, 1).to(block_table.device)).view(-1, PAGE_SIZE)
    slots = torch.zeros(num_blocks, PAGE_SIZE, dtype=torch.int32, device=block_table.device)
    slots.index_add_(0, block_table.long().flatten(), live.int())
    return slots > 0


def wide_tile_cache(k_cache: torch.Tensor, seed: int) -> torch.Tensor:
    """k_cache [..., 576] with each token's four 128-column NoPE tiles multiplied by 10^u, u uniform in
    [-5, 0.5]: FP8 tile scales over 5.5 decades (f16 subnormals and a per-tile running reference at work),
    logits still of order 10 (much larger ones make any change of the fp32 summation order visible in the
    output, whatever the arithmetic). Same dtype and device; drawn on k_cache's device."""
    g = torch.Generator(device=k_cache.device).manual_seed(seed)
    mag = torch.pow(10.0, torch.rand(*k_cache.shape[:-1], 4, generator=g, device=k_cache.device) * 5.5 - 5)
    nope = k_cache[..., :512].float().view(*k_cache.shape[:-1], 4, 128) * mag[..., None]
    return torch.cat([nope.flatten(-2), k_cache[..., 512:].float()], -1).to(k_cache.dtype)


def f16_nope(e: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """NoPE values e [..., 512] with tile scales s [..., 4] (flashmla.quant.split_kvcache) as the FP8 kernel's f16
    consumers (FLASHMLA_FP8_F16=1) compute them, as float32: f16(e4m3 * scale), the scale rounded to f16 where it
    is a normal f16 that cannot overflow an e4m3 value (448 x scale <= 65504), kept in float32 elsewhere."""
    sx = s.repeat_interleave(128, -1)
    sx = torch.where((sx >= 2.0 ** -14) & (sx <= 65504.0 / 448), sx.half().float(), sx)
    return (e * sx).half().float()


def rf_values(k_fp8: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor) -> torch.Tensor:
    """V (float32 [num_blocks, 64, h_kv, 512]) exactly as the register-fed swap-AB kernel forms it, its oracle's
    values beside K from dequantize_kvcache(k, torch.float32): per page and 128-column tile, sigma = the least
    power of two >= the largest scale of the page's live tokens (1 if none), each value f16(e4m3 * f16(scale /
    sigma)) * sigma (two f16 roundings: <= 2^-10 relative, or 2^-16 sigma where scale / sigma is an f16 subnormal);
    0 past each request's length."""
    from .quant import split_kvcache
    e, s, _ = split_kvcache(k_fp8)  # [nb, 64, h, 512], [nb, 64, h, 4]
    live = live_slots(block_table.to(k_fp8.device), cache_seqlens, k_fp8.shape[0])
    sc = torch.where(live[:, :, None, None], s, torch.zeros_like(s))
    mx = sc.amax(dim=1, keepdim=True)
    mant, ex = torch.frexp(mx)  # mx = mant * 2^ex, mant in [0.5, 1)
    ex = torch.where(mant == 0.5, ex - 1, ex).clamp(-126, 126)
    sigma = torch.where(mx > 0, torch.ldexp(torch.ones_like(mx), ex), torch.ones_like(mx))
    fac = (sc / sigma).half().float().repeat_interleave(128, -1)
    v = (e.half().float() * fac).half().float() * sigma.repeat_interleave(128, -1)
    return torch.where(live[:, :, None, None], v, torch.zeros_like(v))


def fp8_query(q: torch.Tensor) -> torch.Tensor:
    """Q as the register-fed kernel uses it under FLASHMLA_FP8_Q=1 (float32): each query row's NoPE part (the first
    512 columns) scaled by 2^-e and rounded to e4m3, e the least exponent with max |row| 2^-e <= 448 (clamped to
    [-100, 100]; 0 for a zero row), then scaled back; RoPE as is."""
    qf = q.float()
    nope = qf[..., :512]
    amax = nope.abs().amax(-1, keepdim=True)
    bits = amax.view(torch.int32)
    e = (bits >> 23) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)
    e = torch.where(amax > 0, e.clamp(-100, 100), torch.zeros_like(e))
    scale = torch.ldexp(torch.ones_like(amax), e)
    q8 = (nope / scale).to(torch.float8_e4m3fn).float() * scale
    return torch.cat([q8, qf[..., 512:]], -1)


def rf_reference(q, k_fp8, block_table, cache_seqlens, causal=False, fp8_q=None):
    """The register-fed swap-AB kernel's oracle: the reference with K from the float32-dequantised cache (exact
    e4m3 values, K's scales applied in fp32) and V as the kernel forms it (rf_values); Q by fp8_query when fp8_q
    (None: when FLASHMLA_FP8_Q=1 is set)."""
    from .quant import dequantize_kvcache
    from .ref import mla_decode_ref
    if fp8_q is None:
        fp8_q = os.environ.get("FLASHMLA_FP8_Q") == "1"
    return mla_decode_ref(fp8_query(q) if fp8_q else q, dequantize_kvcache(k_fp8, torch.float32), block_table, cache_seqlens, 512,
                          causal=causal, v_cache=rf_values(k_fp8, block_table, cache_seqlens))


def fp8_reference(q, k_fp8, block_table, cache_seqlens, causal=False):
    """The oracle of the FP8 kernel that ran last: rf_reference for the register-fed swap-AB kernel; for the others,
    the reference on the bf16-dequantised cache (what they compute)."""
    from .api import _C
    from .quant import dequantize_kvcache
    from .ref import mla_decode_ref
    if _C is not None and _C.last_kernel() == "swapab_rf":
        return rf_reference(q, k_fp8, block_table, cache_seqlens, causal)
    return mla_decode_ref(q, dequantize_kvcache(k_fp8), block_table, cache_seqlens, 512, causal=causal)


def f16_dequantized(k_fp8: torch.Tensor) -> torch.Tensor:
    """The FP8 cache exactly as the f16 consumers see it (float32 [..., 576]): NoPE by f16_nope, RoPE as is; the
    oracle of FLASHMLA_FP8_F16=1."""
    from .quant import split_kvcache
    e, s, rope = split_kvcache(k_fp8)
    return torch.cat([f16_nope(e, s), rope.float()], -1)
