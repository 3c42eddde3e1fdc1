"""Argument checks shared by every public GEMM. Each failure names the argument, what was
expected and what came (TypeError for types/dtypes, ValueError for shapes/layout/values)."""
from __future__ import annotations

import weakref

import torch

from .utils import BLOCK_K, FP8, ceil_div

OUT_DTYPES = (torch.bfloat16, torch.float32, FP8)


def unpack(x, name: str, fp8: bool):
    """(tensor, scale) for the FP8 GEMMs, a plain tensor for the BF16 ones."""
    if fp8:
        if not isinstance(x, (tuple, list)) or len(x) != 2:
            raise TypeError(f"{name}: expected a pair (tensor, scaling factors), got {type(x).__name__}")
        t, sf = x
        if not isinstance(t, torch.Tensor) or not isinstance(sf, torch.Tensor):
            raise TypeError(f"{name}: expected a pair of tensors, got ({type(t).__name__}, {type(sf).__name__})")
        return t, sf
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(x).__name__}")
    return x, None


def _dtype(t: torch.Tensor, name: str, allowed) -> None:
    if t.dtype not in allowed:
        raise TypeError(f"{name}: expected dtype {' or '.join(map(str, allowed))}, got {t.dtype}")


def _shape(t: torch.Tensor, name: str, shape: tuple) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")


def _dense(t: torch.Tensor, name: str) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous row-major (K-major) tensor, got strides {t.stride()}")
    if t.numel() and not torch.compiler.is_compiling() and t.data_ptr() % 16 != 0:
        raise ValueError(f"{name}: expected a 16-byte aligned data pointer (TMA), got address {t.data_ptr():#x}")


def check_operands(a, sfa, b, sfb, d, c, *, a_shape_lead: tuple, b_lead: tuple, fp8: bool):
    """Checks A [*a_lead, M, K], B [*b_lead, N, K], their scales, D and C.
    Returns (M, N, K)."""
    in_dtypes = (FP8,) if fp8 else (torch.bfloat16,)
    _dtype(a, "a", in_dtypes)
    _dtype(b, "b", in_dtypes)
    na, nb = len(a_shape_lead) + 2, len(b_lead) + 2
    if a.dim() != na:
        raise ValueError(f"a: expected {na} dims, got shape {tuple(a.shape)}")
    if b.dim() != nb:
        raise ValueError(f"b: expected {nb} dims, got shape {tuple(b.shape)}")
    m, k = a.shape[-2:]
    n = b.shape[-2]
    if b.shape[-1] != k:
        raise ValueError(f"b: expected K = {k} (a.shape[-1]) in its last dim, got shape {tuple(b.shape)}")
    kalign = BLOCK_K if fp8 else 64
    if k % kalign != 0 or k == 0:
        raise ValueError(f"a: expected K (last dim) a positive multiple of {kalign}, got K = {k}")
    if n % 8 != 0 or n == 0:
        raise ValueError(f"b: expected N (dim -2) a positive multiple of 8, got N = {n}")
    if tuple(b.shape[:-2]) != tuple(b_lead):
        raise ValueError(f"b: expected leading dims {tuple(b_lead)}, got shape {tuple(b.shape)}")
    if tuple(a.shape[:-2]) != tuple(a_shape_lead):
        raise ValueError(f"a: expected leading dims {tuple(a_shape_lead)}, got shape {tuple(a.shape)}")
    _dense(a, "a")
    _dense(b, "b")
    if fp8:
        kb = k // BLOCK_K
        for sf, name, shape in ((sfa, "a scaling factors (a[1])", (*a_shape_lead, m, kb)),
                                (sfb, "b scaling factors (b[1])", (*b_lead, ceil_div(n, BLOCK_K), kb))):
            _dtype(sf, name, (torch.float32,))
            _shape(sf, name, shape)
            if sf.numel() and sf.stride(-1) != 1 and sf.stride(-2) != 1:
                raise ValueError(f"{name}: expected an MN-major or K-major layout, got strides {sf.stride()}")
    _dtype(d, "d", OUT_DTYPES)
    _shape(d, "d", (*a_shape_lead, m, n))
    _dense(d, "d")
    if c is not None:
        _dtype(c, "c", (torch.float32, torch.bfloat16))
        _shape(c, "c", (*a_shape_lead, m, n))
        _dense(c, "c")
    dev = a.device
    for t, name in ((b, "b"), (sfa, "a[1]"), (sfb, "b[1]"), (d, "d"), (c, "c")):
        if t is not None and t.device != dev:
            raise ValueError(f"{name}: expected device {dev} (that of a), got {t.device}")
    return m, n, k


def _can_read_values(t: torch.Tensor) -> bool:
    """Host reads of device values are skipped while capturing a CUDA graph or compiling."""
    if torch.compiler.is_compiling():
        return False
    if t.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    return True


# The tensor whose values passed each value check last, its version counter and the bounds it passed: an unchanged
# tensor (same object, same version: PyTorch bumps it on every in-place write) is not read again, so the GEMMs of
# one MoE layer sharing m_indices or masked_m sync once. A kernel writing through a raw pointer does not bump it;
# inference tensors (torch.inference_mode) have no version counter and are read at every call.
_passed: dict = {}


def _unchanged_since_passed(check: str, t: torch.Tensor, bounds: tuple) -> bool:
    ref, version, passed = _passed.get(check, (None, -1, None))  # (_mark_passed records no inference tensor)
    return ref is not None and ref() is t and version == t._version and passed == bounds


def _mark_passed(check: str, t: torch.Tensor, bounds: tuple) -> None:
    if not t.is_inference():   # (inference tensors keep no version counter: checked every call)
        _passed[check] = (weakref.ref(t), t._version, bounds)


def _read(*scalars: torch.Tensor) -> list:
    """Device scalars to host numbers in one sync (eager mode only)."""
    return torch.stack(scalars).tolist()


def check_m_indices(m_indices: torch.Tensor, m: int, num_groups: int, device) -> None:
    _dtype(m_indices, "m_indices", (torch.int32,))
    _shape(m_indices, "m_indices", (m,))
    if m_indices.device != device:
        raise ValueError(f"m_indices: expected device {device}, got {m_indices.device}")
    if not m_indices.is_contiguous():
        raise ValueError("m_indices: expected a contiguous tensor")
    if m == 0 or not _can_read_values(m_indices) or _unchanged_since_passed("m_indices", m_indices, (num_groups,)):
        return
    idx = m_indices.long()
    prev = torch.cat([idx.new_full((1,), -2), idx[:-1]])
    starts = (idx >= 0) & (idx != prev)
    pos = torch.arange(m, device=idx.device)
    bad_start = starts & (pos % 128 != 0)
    first_bad = torch.where(bad_start, pos, m).min()
    lo, hi, first = _read(idx.min(), idx.max(), first_bad)
    if lo < -1 or hi >= num_groups:
        raise ValueError(f"m_indices: expected values in [-1, {num_groups}), got range [{lo}, {hi}]")
    if first < m:
        raise ValueError(f"m_indices: expected each group's block of rows to start on a multiple of 128 "
                         f"(get_m_alignment_for_contiguous_layout()), got a block starting at row {first}")
    _mark_passed("m_indices", m_indices, (num_groups,))


def check_masked_m(masked_m: torch.Tensor, num_groups: int, m_max: int, expected_m, device) -> None:
    _dtype(masked_m, "masked_m", (torch.int32,))
    _shape(masked_m, "masked_m", (num_groups,))
    if masked_m.device != device:
        raise ValueError(f"masked_m: expected device {device}, got {masked_m.device}")
    if not isinstance(expected_m, int) or isinstance(expected_m, bool) or expected_m < 0:
        raise TypeError(f"expected_m: expected a non-negative int hint, got {expected_m!r}")
    if num_groups == 0 or not _can_read_values(masked_m) or _unchanged_since_passed("masked_m", masked_m, (m_max,)):
        return
    lo, hi = _read(*torch.aminmax(masked_m))
    if lo < 0 or hi > m_max:
        raise ValueError(f"masked_m: expected values in [0, {m_max}] (M_max = a.shape[1]), got range [{lo}, {hi}]")
    _mark_passed("masked_m", masked_m, (m_max,))
