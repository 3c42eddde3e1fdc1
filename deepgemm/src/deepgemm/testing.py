"""Test helpers, as in DeepGEMM's `deep_gemm.testing`: the diff metric and input generators."""
from __future__ import annotations

import torch

from .ref import calc_diff  # noqa: F401
from .utils import per_block_cast_to_fp8, per_token_cast_to_fp8


def make_dense(m: int, n: int, k: int, device="cpu", seed: int = 0):
    """Random bf16 x [M, K], y [N, K] and their FP8 casts ((x_fp8, sfx), (y_fp8, sfy))."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(device=device, dtype=torch.bfloat16)
    y = torch.randn(n, k, generator=gen).to(device=device, dtype=torch.bfloat16)
    return x, y, per_token_cast_to_fp8(x), per_block_cast_to_fp8(y)


def make_contiguous_m_indices(group_ms: list[int], align: int = 128, device="cpu") -> torch.Tensor:
    """m_indices for groups of group_ms[g] rows, each block padded with -1 to a multiple of align."""
    parts = []
    for g, m in enumerate(group_ms):
        pad = (align - m % align) % align
        parts += [torch.full((m,), g, dtype=torch.int32), torch.full((pad,), -1, dtype=torch.int32)]
    return torch.cat(parts).to(device) if parts else torch.empty(0, dtype=torch.int32, device=device)
