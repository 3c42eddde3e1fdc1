"""Plain-PyTorch oracle: fp32 matmul of the dequantised inputs. Also the CPU path of every op."""
from __future__ import annotations

import torch

from .utils import BLOCK_K


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity metric: 1 - 2*sum(x*y) / sum(x*x + y*y), in float64 (0 = identical)."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    if denom == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denom)


def dequant_per_token(x: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """x [..., M, K] fp8, sf [..., M, ceil(K/128)] -> float32 [..., M, K]."""
    k = x.shape[-1]
    return x.float() * sf.float().repeat_interleave(BLOCK_K, dim=-1)[..., :k]


def dequant_per_block(x: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """x [..., N, K] fp8, sf [..., ceil(N/128), ceil(K/128)] -> float32 [..., N, K]."""
    n, k = x.shape[-2:]
    s = sf.float().repeat_interleave(BLOCK_K, dim=-2)[..., :n, :]
    return x.float() * s.repeat_interleave(BLOCK_K, dim=-1)[..., :k]


def _dequant_b(b: torch.Tensor, sfb: torch.Tensor | None) -> torch.Tensor:
    return b.float() if sfb is None else dequant_per_block(b, sfb)


def _dequant_a(a: torch.Tensor, sfa: torch.Tensor | None) -> torch.Tensor:
    return a.float() if sfa is None else dequant_per_token(a, sfa)


def ref_gemm_nt(a, sfa, b, sfb, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """d[M, N] = A[M, K] @ B[N, K]^T (+ c), in float32, written into d (any float dtype).
    sfa/sfb None means the operand is already in high precision (the BF16 path)."""
    out = _dequant_a(a, sfa) @ _dequant_b(b, sfb).t()
    if c is not None:
        out = out + c.float()
    d.copy_(out.to(d.dtype))


def ref_m_grouped_gemm_nt_contiguous(a, sfa, b, sfb, d: torch.Tensor, m_indices: torch.Tensor) -> None:
    """Rows r of A[M, K] with m_indices[r] = g >= 0 get d[r] = A[r] @ B[g]^T; rows with -1 are
    left untouched. B: [G, N, K]."""
    af = _dequant_a(a, sfa)
    bf = _dequant_b(b, sfb)
    idx = m_indices.to(torch.long)
    for g in torch.unique(idx[idx >= 0]).tolist():
        rows = (idx == g).nonzero().flatten()
        d[rows] = (af[rows] @ bf[g].t()).to(d.dtype)


def ref_m_grouped_gemm_nt_masked(a, sfa, b, sfb, d: torch.Tensor, masked_m: torch.Tensor) -> None:
    """For each group g: d[g, :masked_m[g]] = A[g, :masked_m[g]] @ B[g]^T; other rows untouched.
    A: [G, M_max, K], B: [G, N, K], d: [G, M_max, N]."""
    af = _dequant_a(a, sfa)
    bf = _dequant_b(b, sfb)
    counts = masked_m.to("cpu", torch.long).tolist()
    for g, m in enumerate(counts):
        m = max(0, min(m, a.shape[1]))
        if m:
            d[g, :m] = (af[g, :m] @ bf[g].t()).to(d.dtype)
