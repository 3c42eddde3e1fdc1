"""The public GEMMs (DeepGEMM names and argument order) and their torch.library custom ops.

Every op computes D = A @ B^T (+ C) with A row-major [M, K] ("N" layout: K-major) and B [N, K]
("T"): hence "_nt". The FP8 ops take (tensor, scaling factors) pairs: A's factors are per 1x128
group along K ([M, K/128] float32), B's per 128x128 block ([N/128, K/128] float32).
On CUDA (sm_90) the ops run the JIT-compiled kernels of deepgemm.jit; elsewhere the reference."""
from __future__ import annotations

import warnings
from typing import Optional

import torch

from . import ref
from .utils import get_mn_major_tma_aligned_tensor
from .validate import check_m_indices, check_masked_m, check_operands, unpack

_warned = False
_capability: dict = {}


def _use_kernels(t: torch.Tensor) -> bool:
    global _warned
    if not t.is_cuda:
        return False
    cap = _capability.get(t.device)
    if cap is None:
        cap = _capability[t.device] = torch.cuda.get_device_capability(t.device)
    if cap != (9, 0):
        if not _warned:
            warnings.warn("deepgemm: kernels need sm_90 (Hopper); using the PyTorch reference")
            _warned = True
        return False
    return True


# custom ops (mutate d; fake impls do nothing, so they trace under torch.compile). Eager calls on plain tensors run
# the bodies directly, without the ops' dispatch (_run); torch.compile, export and opcheck see the ops.
def _gemm_nt_impl(a: torch.Tensor, sfa: Optional[torch.Tensor], b: torch.Tensor, sfb: Optional[torch.Tensor],
                  d: torch.Tensor, c: Optional[torch.Tensor]) -> None:
    if _use_kernels(a):
        from .jit import kernels
        kernels.gemm_nt(a, sfa, b, sfb, d, c)
    else:
        ref.ref_gemm_nt(a, sfa, b, sfb, d, c)


_gemm_nt_op = torch.library.custom_op("deepgemm::gemm_nt", mutates_args=("d",))(_gemm_nt_impl)


@_gemm_nt_op.register_fake
def _(a, sfa, b, sfb, d, c) -> None:
    return None


def _contiguous_impl(a: torch.Tensor, sfa: Optional[torch.Tensor], b: torch.Tensor, sfb: Optional[torch.Tensor],
                     d: torch.Tensor, m_indices: torch.Tensor) -> None:
    if _use_kernels(a):
        from .jit import kernels
        kernels.m_grouped_gemm_nt_contiguous(a, sfa, b, sfb, d, m_indices)
    else:
        ref.ref_m_grouped_gemm_nt_contiguous(a, sfa, b, sfb, d, m_indices)


_contiguous_op = torch.library.custom_op("deepgemm::m_grouped_gemm_nt_contiguous", mutates_args=("d",))(
    _contiguous_impl)


@_contiguous_op.register_fake
def _(a, sfa, b, sfb, d, m_indices) -> None:
    return None


def _masked_impl(a: torch.Tensor, sfa: Optional[torch.Tensor], b: torch.Tensor, sfb: Optional[torch.Tensor],
                 d: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> None:
    if _use_kernels(a):
        from .jit import kernels
        kernels.m_grouped_gemm_nt_masked(a, sfa, b, sfb, d, masked_m, expected_m)
    else:
        ref.ref_m_grouped_gemm_nt_masked(a, sfa, b, sfb, d, masked_m)


_masked_op = torch.library.custom_op("deepgemm::m_grouped_gemm_nt_masked", mutates_args=("d",))(_masked_impl)


@_masked_op.register_fake
def _(a, sfa, b, sfb, d, masked_m, expected_m) -> None:
    return None


def _run(op, impl, a: torch.Tensor, sfa, b, sfb, d: torch.Tensor, *rest) -> None:
    """impl directly for eager calls on plain tensors (fake and proxy tensors are subclasses), else the op. The
    kernels write d through its pointer: its version counter is bumped as the op's dispatch would."""
    if torch.compiler.is_compiling() or type(a) is not torch.Tensor:
        return op(a, sfa, b, sfb, d, *rest)
    impl(a, sfa, b, sfb, d, *rest)
    torch.autograd.graph.increment_version(d)


def _check_recipe(recipe) -> None:
    if recipe is not None and tuple(recipe) != (1, 128, 128):
        raise ValueError(f"recipe: expected None or (1, 128, 128) (per-token A, per-block B), got {recipe!r}")


def _sf(sf):
    return None if sf is None else get_mn_major_tma_aligned_tensor(sf)


# dense
def _dense(a, b, d, c, fp8: bool) -> None:
    a, sfa = unpack(a, "a", fp8)
    b, sfb = unpack(b, "b", fp8)
    m, _, _ = check_operands(a, sfa, b, sfb, d, c, a_shape_lead=(), b_lead=(), fp8=fp8)
    if m == 0:
        return
    _run(_gemm_nt_op, _gemm_nt_impl, a, _sf(sfa), b, sfb.contiguous() if fp8 else None, d, c)


def fp8_gemm_nt(a, b, d: torch.Tensor, c: Optional[torch.Tensor] = None, recipe=None,
                compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> None:
    """D = A @ B^T (+ C) with fine-grained FP8 scaling.

    a: (A [M, K] float8_e4m3fn, SFA [M, K/128] float32), b: (B [N, K] float8_e4m3fn,
    SFB [ceil(N/128), K/128] float32); d: [M, N] bfloat16, float32 or float8_e4m3fn (written);
    c: optional [M, N] float32/bfloat16 added to the product. K % 128 == 0, N % 8 == 0.
    `compiled_dims` and `disable_ue8m0_cast` are accepted for API compatibility (N and K are
    always compile-time constants; SM90 scales are float32, never UE8M0)."""
    _check_recipe(recipe)
    _dense(a, b, d, c, fp8=True)


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: Optional[torch.Tensor] = None,
                 compiled_dims: str = "nk") -> None:
    """D = A @ B^T (+ C); a: [M, K] bfloat16, b: [N, K] bfloat16, d: [M, N] (K % 64 == 0)."""
    _dense(a, b, d, c, fp8=False)


# M-grouped, contiguous (MoE prefill)
def _contiguous(a, b, d, m_indices, fp8: bool) -> None:
    a, sfa = unpack(a, "a", fp8)
    b, sfb = unpack(b, "b", fp8)
    if not isinstance(b, torch.Tensor) or b.dim() != 3:
        raise ValueError(f"b: expected 3 dims [G, N, K], got shape {tuple(getattr(b, 'shape', ()))}")
    m, _, _ = check_operands(a, sfa, b, sfb, d, None, a_shape_lead=(), b_lead=(b.shape[0],), fp8=fp8)
    if not isinstance(m_indices, torch.Tensor):
        raise TypeError(f"m_indices: expected a tensor, got {type(m_indices).__name__}")
    check_m_indices(m_indices, m, b.shape[0], a.device)
    if m == 0:
        return
    _run(_contiguous_op, _contiguous_impl, a, _sf(sfa), b, sfb.contiguous() if fp8 else None, d, m_indices)


def m_grouped_fp8_gemm_nt_contiguous(a, b, d: torch.Tensor, m_indices: torch.Tensor, recipe=None,
                                     compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> None:
    """Grouped GEMM, rows of A grouped by expert: d[r] = A[r] @ B[m_indices[r]]^T.

    a: (A [M, K] fp8, SFA [M, K/128]); b: (B [G, N, K] fp8, SFB [G, ceil(N/128), K/128]);
    d: [M, N]; m_indices: [M] int32, the group of each row or -1 for padding (left untouched);
    each group's block of rows starts on a multiple of 128."""
    _check_recipe(recipe)
    _contiguous(a, b, d, m_indices, fp8=True)


def m_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
                                      m_indices: torch.Tensor, compiled_dims: str = "nk") -> None:
    """BF16 version of m_grouped_fp8_gemm_nt_contiguous (a [M, K], b [G, N, K] bfloat16)."""
    _contiguous(a, b, d, m_indices, fp8=False)


# M-grouped, masked (MoE decode under CUDA graphs)
def _masked(a, b, d, masked_m, expected_m, fp8: bool) -> None:
    a, sfa = unpack(a, "a", fp8)
    b, sfb = unpack(b, "b", fp8)
    if a.dim() != 3:
        raise ValueError(f"a: expected 3 dims [G, M_max, K], got shape {tuple(a.shape)}")
    g = a.shape[0]
    check_operands(a, sfa, b, sfb, d, None, a_shape_lead=(g,), b_lead=(g,), fp8=fp8)
    if not isinstance(masked_m, torch.Tensor):
        raise TypeError(f"masked_m: expected a tensor, got {type(masked_m).__name__}")
    check_masked_m(masked_m, g, a.shape[1], expected_m, a.device)
    if g == 0 or a.shape[1] == 0:
        return
    _run(_masked_op, _masked_impl, a, _sf(sfa), b, sfb.contiguous() if fp8 else None, d, masked_m,
         int(expected_m))


def m_grouped_fp8_gemm_nt_masked(a, b, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int, recipe=None,
                                 compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> None:
    """Grouped GEMM on padded per-group batches: d[g, :masked_m[g]] = A[g, :masked_m[g]] @ B[g]^T.

    a: (A [G, M_max, K] fp8, SFA [G, M_max, K/128]); b: (B [G, N, K] fp8, SFB [G, ceil(N/128), K/128]);
    d: [G, M_max, N] (rows past masked_m[g] untouched); masked_m: [G] int32 on a's device;
    expected_m: host-side hint of the typical masked_m, used to pick block sizes."""
    _check_recipe(recipe)
    _masked(a, b, d, masked_m, expected_m, fp8=True)


def m_grouped_bf16_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, masked_m: torch.Tensor,
                                  expected_m: int, compiled_dims: str = "nk") -> None:
    """BF16 version of m_grouped_fp8_gemm_nt_masked (a [G, M_max, K], b [G, N, K] bfloat16)."""
    _masked(a, b, d, masked_m, expected_m, fp8=False)


# first-release names
def gemm_fp8_fp8_bf16_nt(lhs, rhs, out: torch.Tensor) -> None:
    """Alias of fp8_gemm_nt (DeepGEMM v1 name)."""
    fp8_gemm_nt(lhs, rhs, out)


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs, rhs, out: torch.Tensor, m_indices: torch.Tensor) -> None:
    """Alias of m_grouped_fp8_gemm_nt_contiguous (DeepGEMM v1 name)."""
    m_grouped_fp8_gemm_nt_contiguous(lhs, rhs, out, m_indices)


def m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs, rhs, out: torch.Tensor, masked_m: torch.Tensor,
                                          expected_m: int) -> None:
    """Alias of m_grouped_fp8_gemm_nt_masked (DeepGEMM v1 name)."""
    m_grouped_fp8_gemm_nt_masked(lhs, rhs, out, masked_m, expected_m)
