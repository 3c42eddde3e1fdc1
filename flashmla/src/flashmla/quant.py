"""FP8 (e4m3) KV cache: layout, quantise and dequantise helpers.

Layout of one token of one KV head: 656 bytes, stored as uint8 [num_blocks, 64, h_kv, 656]
    bytes [0, 512)    the 512 "NoPE" columns (which are also V) as float8_e4m3fn
    bytes [512, 528)  4 float32 scales, one per 128-column tile of the NoPE part
    bytes [528, 656)  the 64 RoPE columns, kept in bfloat16 (not quantised)
A NoPE value is fp8 · scale of its tile; scale = amax(|tile|) / 448 (448 = largest e4m3 value),
so each tile uses the full e4m3 range. This is the layout of FlashMLA's FP8 cache for DeepSeek-V3.2.
"""
from __future__ import annotations

import torch

D_NOPE, D_ROPE, TILE = 512, 64, 128
FP8_BYTES = D_NOPE + 4 * (D_NOPE // TILE) + 2 * D_ROPE   # 656
E4M3_MAX = 448.0


def quantize_kvcache(k_cache: torch.Tensor) -> torch.Tensor:
    """k_cache: bf16/fp16/fp32 [..., 576] -> uint8 [..., 656] in the layout above."""
    if k_cache.shape[-1] != D_NOPE + D_ROPE:
        raise ValueError(f"quantize_kvcache: k_cache last dim must be {D_NOPE + D_ROPE}, got {k_cache.shape[-1]}")
    lead = k_cache.shape[:-1]
    nope = k_cache[..., :D_NOPE].float().reshape(*lead, D_NOPE // TILE, TILE)
    scale = nope.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30) / E4M3_MAX   # [..., 4, 1]
    fp8 = (nope / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).reshape(*lead, D_NOPE)
    out = torch.empty(*lead, FP8_BYTES, dtype=torch.uint8, device=k_cache.device)
    out[..., :D_NOPE] = fp8.view(torch.uint8)
    out[..., D_NOPE:D_NOPE + 16] = scale.reshape(*lead, 4).contiguous().view(torch.uint8)
    out[..., D_NOPE + 16:] = k_cache[..., D_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return out


def _parts(k_fp8: torch.Tensor, who: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if k_fp8.dtype != torch.uint8 or k_fp8.shape[-1] != FP8_BYTES:
        raise ValueError(f"{who}: expected k_fp8 uint8 [..., {FP8_BYTES}], got {k_fp8.dtype} {tuple(k_fp8.shape)}")
    raw = k_fp8.contiguous()
    nope = raw[..., :D_NOPE].view(torch.float8_e4m3fn).float()
    scale = raw[..., D_NOPE:D_NOPE + 16].view(torch.float32)
    return nope, scale, raw[..., D_NOPE + 16:].view(torch.bfloat16)


def split_kvcache(k_fp8: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """uint8 [..., 656] in the layout above -> its parts: the e4m3 NoPE values as float32 (exact) [..., 512],
    the tile scales float32 [..., 4] and the RoPE columns bfloat16 [..., 64]."""
    return _parts(k_fp8, "split_kvcache")


def dequantize_kvcache(k_fp8: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """uint8 [..., 656] in the layout above -> [..., 576] of dtype: bf16 (the default) or float32. Each NoPE
    value is fp8 · scale computed in float32 (relative error <= 2^-24), then for bf16 rounded once more."""
    nope, scale, rope = _parts(k_fp8, "dequantize_kvcache")
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"dequantize_kvcache: dtype must be torch.bfloat16 or torch.float32, got {dtype}")
    lead = k_fp8.shape[:-1]
    nope = nope.reshape(*lead, D_NOPE // TILE, TILE) * scale.reshape(*lead, D_NOPE // TILE, 1)
    return torch.cat([nope.reshape(*lead, D_NOPE).to(dtype), rope.to(dtype)], dim=-1)
