"""Configs, layout helpers and FP8 cast utilities (plain PyTorch, any device)."""
from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK_K = 128  # granularity of the scaling factors along K (and of B's along N)

_num_sms: int | None = None
_device_sms: dict[int, int] = {}


# configs
def ceil_div(x: int, y: int) -> int:
    """Ceil of x / y for non-negative ints."""
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    return ceil_div(x, y) * y


def set_num_sms(num_sms: int) -> None:
    """Cap the number of SMs the persistent kernels use (default: all of the current device)."""
    if not isinstance(num_sms, int) or isinstance(num_sms, bool) or num_sms < 1:
        raise ValueError(f"num_sms: expected a positive int, got {num_sms!r}")
    global _num_sms
    if torch.cuda.is_available():
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        if num_sms > total:
            raise ValueError(f"num_sms: expected <= {total} (SMs of the device), got {num_sms}")
    _num_sms = num_sms


def get_num_sms() -> int:
    """SMs the kernels use: the value of set_num_sms, else the device's count (132 on H100/H200
    SXM; 132 is also what is reported on a machine without CUDA)."""
    if _num_sms is not None:
        return _num_sms
    if torch.cuda.is_available():
        dev = torch.cuda.current_device()
        if dev not in _device_sms:
            _device_sms[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
        return _device_sms[dev]
    return 132


def get_m_alignment_for_contiguous_layout() -> int:
    """Row alignment of each group's block in the M-grouped contiguous layout."""
    return 128


get_mk_alignment_for_contiguous_layout = get_m_alignment_for_contiguous_layout


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """x rounded up so that x * element_size is a multiple of 16 bytes (TMA stride rule)."""
    if 16 % element_size != 0:
        raise ValueError(f"element_size: expected a divisor of 16, got {element_size}")
    return align(x, 16 // element_size)


def is_mn_major_tma_aligned(sf: torch.Tensor) -> bool:
    """True if sf ([..., MN, KB]) has stride 1 along MN and a TMA-aligned stride along KB."""
    mn, kb = sf.shape[-2], sf.shape[-1]
    aligned = get_tma_aligned_size(mn, sf.element_size())
    if sf.stride(-2) != 1 or (kb > 1 and sf.stride(-1) != aligned):
        return False
    if sf.dim() == 3 and sf.shape[0] > 1 and sf.stride(0) != aligned * kb:
        return False
    return True


def get_mn_major_tma_aligned_tensor(sf: torch.Tensor) -> torch.Tensor:
    """Return sf ([MN, KB] or [G, MN, KB], float32) with the layout the kernels load by TMA:
    MN-major (stride 1 along MN), MN padded to a multiple of 4 (16 bytes). Values and shape are
    unchanged; the tensor is returned as is when it already has that layout."""
    if sf.dim() not in (2, 3):
        raise ValueError(f"sf: expected a 2-D or 3-D tensor, got shape {tuple(sf.shape)}")
    if is_mn_major_tma_aligned(sf):
        return sf
    squeeze = sf.dim() == 2
    x = sf.unsqueeze(0) if squeeze else sf
    g, mn, kb = x.shape
    aligned = get_tma_aligned_size(mn, x.element_size())
    out = torch.empty((g, kb, aligned), dtype=x.dtype, device=x.device)
    out[:, :, :mn].copy_(x.transpose(1, 2))
    out = out[:, :, :mn].transpose(1, 2)
    return out.squeeze(0) if squeeze else out


get_col_major_tma_aligned_tensor = get_mn_major_tma_aligned_tensor


# FP8 casts
def per_token_cast_to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise x ([..., M, K], float) per 1x128 group along K.

    Returns (x_fp8 [..., M, K] float8_e4m3fn, sf [..., M, ceil(K/128)] float32) with
    x ~= x_fp8 * sf (sf repeated over each group of 128 columns)."""
    if not x.is_floating_point():
        raise TypeError(f"x: expected a floating-point tensor, got {x.dtype}")
    if x.dim() < 2:
        raise ValueError(f"x: expected at least 2 dims [..., M, K], got shape {tuple(x.shape)}")
    k = x.shape[-1]
    kp = align(k, BLOCK_K)
    xf = torch.nn.functional.pad(x.float(), (0, kp - k)).unflatten(-1, (kp // BLOCK_K, BLOCK_K))
    amax = xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4)
    sf = amax / FP8_MAX
    q = (xf / sf).to(FP8).flatten(-2)[..., :k].contiguous()
    return q, sf.squeeze(-1)


def per_block_cast_to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise x ([..., N, K], float) per 128x128 block.

    Returns (x_fp8 [..., N, K] float8_e4m3fn, sf [..., ceil(N/128), ceil(K/128)] float32)."""
    if not x.is_floating_point():
        raise TypeError(f"x: expected a floating-point tensor, got {x.dtype}")
    if x.dim() < 2:
        raise ValueError(f"x: expected at least 2 dims [..., N, K], got shape {tuple(x.shape)}")
    n, k = x.shape[-2:]
    npad, kp = align(n, BLOCK_K), align(k, BLOCK_K)
    xp = torch.nn.functional.pad(x.float(), (0, kp - k, 0, npad - n))
    xb = xp.unflatten(-1, (kp // BLOCK_K, BLOCK_K)).unflatten(-3, (npad // BLOCK_K, BLOCK_K))
    # xb: [..., NB, 128, KB, 128]
    amax = xb.abs().amax(dim=(-3, -1), keepdim=True).clamp(min=1e-4)
    sf = amax / FP8_MAX
    q = (xb / sf).to(FP8).flatten(-2).flatten(-3, -2)[..., :n, :k].contiguous()
    return q, sf.squeeze(-1).squeeze(-2)


def per_channel_cast_to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise x ([..., M, K]) per row with one scale (used for per-tensor peers): returns
    (x_fp8, sf [..., M, 1])."""
    amax = x.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-4)
    sf = amax / FP8_MAX
    return (x.float() / sf).to(FP8), sf
