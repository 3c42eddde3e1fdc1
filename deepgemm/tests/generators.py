"""Shared input generators and the independent blockwise oracle for the GEMM tests."""
import torch

import deepgemm as dg

NAN = float("nan")


def gen(seed):
    return torch.Generator().manual_seed(seed)


def rand(shape, seed, device, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape, generator=gen(seed)) * scale).to(device=device, dtype=dtype)


def fp8_pair_token(x):
    return dg.per_token_cast_to_fp8(x)


def fp8_pair_block(y):
    return dg.per_block_cast_to_fp8(y)


def blockwise_oracle(a, sfa, b, sfb):
    """float64 sum over 128-wide K blocks of (A_blk @ B_blk^T) * sfa[row, kb] * sfb[col // 128, kb]:
    the promoted-accumulation formula, computed independently of deepgemm.ref."""
    m, k = a.shape
    n = b.shape[0]
    out = torch.zeros(m, n, dtype=torch.float64, device=a.device)
    sfb_rows = sfb.double().repeat_interleave(128, dim=0)[:n]
    for kb in range(k // 128):
        sl = slice(kb * 128, kb * 128 + 128)
        part = a[:, sl].double() @ b[:, sl].double().t()
        out += part * sfa[:, kb].double()[:, None] * sfb_rows[:, kb][None, :]
    return out


def poisoned(shape, dtype, device):
    return torch.full(shape, NAN, dtype=torch.float32, device=device).to(dtype)
