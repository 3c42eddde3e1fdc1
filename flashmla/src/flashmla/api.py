"""Public API (FlashMLA names and arguments), input validation and the torch.library custom ops.

Dispatch: CUDA tensors with bf16 q, h_kv = 1, d = 576, head_dim_v = 512 run the CUDA kernel when
the extension was built with CUDA; everything else (CPU tensors, other shapes, fp16) runs the
plain-PyTorch reference in ref.py.
"""
from __future__ import annotations

import math
import os
import weakref

import torch

from . import ref
from .quant import FP8_BYTES, dequantize_kvcache

try:
    from . import _C
except ImportError:  # source tree without a build: reference path only
    _C = None

CPU_NUM_SMS = 132  # SM count assumed by get_mla_metadata for CPU tensors (an H100/H200 SXM)


def cuda_available() -> bool:
    """True when the CUDA kernels were compiled in and a CUDA device is present."""
    return _C is not None and _C.with_cuda() and torch.cuda.is_available()


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_NUM_SMS


MAX_SEG_OVERHEAD = 255  # FLASHMLA_SPLIT_OVH range (csrc/launch.h kMaxSegOverhead)


def split_overhead_setting() -> int:
    """Pages the scheduler charges per segment (read at every get_mla_metadata call, on the GPU and
    on the CPU alike): ref.SEG_OVERHEAD (5) when FLASHMLA_SPLIT_OVH is unset or empty, else its
    value, an int in 0..255."""
    v = os.environ.get("FLASHMLA_SPLIT_OVH", "")
    if not v:
        return ref.SEG_OVERHEAD
    try:
        c = int(v)
    except ValueError:
        c = -1
    if not 0 <= c <= MAX_SEG_OVERHEAD:
        raise ValueError(f"FLASHMLA_SPLIT_OVH: expected an int in 0..{MAX_SEG_OVERHEAD} (pages per segment), got {v!r}")
    return c


# ----------------------------------------------------------------------------- metadata op
@torch.library.custom_op("flashmla::get_mla_metadata", mutates_args=())
def _metadata_op(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int,
                 num_heads_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    parts = ref.num_sm_parts_for(_num_sms(cache_seqlens.device), num_q_tokens_per_head_k, num_heads_k)
    seg_ovh = split_overhead_setting()
    if cache_seqlens.is_cuda and cuda_available():
        batch = cache_seqlens.shape[0]
        meta = torch.empty(parts, ref.META_SIZE, dtype=torch.int32, device=cache_seqlens.device)
        splits = torch.empty(batch + 1, dtype=torch.int32, device=cache_seqlens.device)
        _C.mla_metadata(cache_seqlens.data_ptr(), batch, parts, meta.data_ptr(), splits.data_ptr(), seg_ovh,
                        torch.cuda.current_stream(cache_seqlens.device).cuda_stream)
        return meta, splits
    meta, splits = ref.schedule_ref(cache_seqlens, parts, seg_ovh)
    return meta.to(cache_seqlens.device), splits.to(cache_seqlens.device)


@_metadata_op.register_fake
def _(cache_seqlens, num_q_tokens_per_head_k, num_heads_k):
    parts = ref.num_sm_parts_for(_num_sms(cache_seqlens.device), num_q_tokens_per_head_k, num_heads_k)
    return (cache_seqlens.new_empty((parts, ref.META_SIZE)),
            cache_seqlens.new_empty((cache_seqlens.shape[0] + 1,)))


def get_mla_metadata(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int,
                     num_heads_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Plan the split-KV work of one decode step (computed on cache_seqlens' device, no host sync).

    cache_seqlens:            int32 [batch]
    num_q_tokens_per_head_k:  s_q · h_q / h_kv (query rows that share one KV head)
    num_heads_k:              h_kv
    Returns tile_scheduler_metadata int32 [num_sm_parts, 8] and num_splits int32 [batch + 1];
    num_sm_parts = SMs // h_kv // ceil(num_q_tokens_per_head_k / 64). Reuse them for every layer
    of the step. Scheduler: ref.schedule_ref, every segment (a request or a piece of one on one
    part) costs its pages + 5 (FLASHMLA_SPLIT_OVH=c sets another c in 0..255).
    """
    if not isinstance(cache_seqlens, torch.Tensor):
        raise TypeError(f"cache_seqlens: expected a torch.Tensor, got {type(cache_seqlens).__name__}")
    if cache_seqlens.dtype != torch.int32 or cache_seqlens.dim() != 1:
        raise ValueError(f"cache_seqlens: expected int32 [batch], got {cache_seqlens.dtype} {tuple(cache_seqlens.shape)}")
    if cache_seqlens.shape[0] < 1:
        raise ValueError("cache_seqlens: batch must be >= 1")
    for name, v in (("num_q_tokens_per_head_k", num_q_tokens_per_head_k), ("num_heads_k", num_heads_k)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}: expected a positive int, got {v!r}")
    return _metadata_op(cache_seqlens.contiguous(), num_q_tokens_per_head_k, num_heads_k)


# ----------------------------------------------------------------------------- decode op
def _kernel_ok(q, k_cache, head_dim_v, is_fp8) -> bool:
    return (q.is_cuda and cuda_available() and q.dtype == torch.bfloat16 and q.shape[-1] == 576
            and head_dim_v == 512 and k_cache.shape[2] == 1
            and (_C.fp8_kernel() if is_fp8 else k_cache.dtype == torch.bfloat16))


def _decode_impl(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                 cache_seqlens: torch.Tensor, head_dim_v: int, tile_scheduler_metadata: torch.Tensor,
                 num_splits: torch.Tensor, softmax_scale: float, causal: bool,
                 is_fp8_kvcache: bool) -> tuple[torch.Tensor, torch.Tensor]:
    batch, s_q, h_q, d = q.shape
    if _kernel_ok(q, k_cache, head_dim_v, is_fp8_kvcache):
        m = s_q * h_q
        parts = tile_scheduler_metadata.shape[0]
        out = torch.empty(batch, s_q, h_q, head_dim_v, dtype=q.dtype, device=q.device)
        lse = torch.empty(batch, h_q, s_q, dtype=torch.float32, device=q.device)
        oacc = torch.empty(batch + parts, m, head_dim_v, dtype=torch.float32, device=q.device)
        lacc = torch.empty(batch + parts, m, dtype=torch.float32, device=q.device)
        _C.mla_decode(q.data_ptr(), k_cache.data_ptr(), k_cache.stride(0), k_cache.shape[0], int(is_fp8_kvcache),
                      block_table.data_ptr(), block_table.stride(0), block_table.shape[1],
                      cache_seqlens.data_ptr(), tile_scheduler_metadata.data_ptr(), parts,
                      num_splits.data_ptr(), out.data_ptr(), lse.data_ptr(), oacc.data_ptr(),
                      lacc.data_ptr(), batch, s_q, h_q, float(softmax_scale), int(causal),
                      torch.cuda.current_stream(q.device).cuda_stream)
        return out, lse
    kv = dequantize_kvcache(k_cache) if is_fp8_kvcache else k_cache
    out, lse = ref.mla_decode_ref(q, kv, block_table, cache_seqlens, head_dim_v, softmax_scale, causal)
    return out.to(q.dtype), lse


# the custom op (torch.compile, opcheck, export); eager calls on plain tensors run _decode_impl directly, without
# the op's dispatch (BENCHMARKS.md session 20: host time per call)
_decode_op = torch.library.custom_op("flashmla::mla_decode", mutates_args=())(_decode_impl)


@_decode_op.register_fake
def _(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
      softmax_scale, causal, is_fp8_kvcache):
    batch, s_q, h_q, _ = q.shape
    return (q.new_empty((batch, s_q, h_q, head_dim_v)),
            q.new_empty((batch, h_q, s_q), dtype=torch.float32))


def _check(cond: bool, exc: type, msg) -> None:
    """Raises exc(msg) unless cond; msg is a string or a function that builds it (the f-strings of _validate are
    built only on failure: formatting them at every call was half of its time)."""
    if not cond:
        raise exc(msg() if callable(msg) else msg)


def _validate(q, k_cache, block_table, cache_seqlens, head_dim_v, meta, num_splits, is_fp8):
    names = ("q", "k_cache", "block_table", "cache_seqlens", "tile_scheduler_metadata", "num_splits")
    tensors = (q, k_cache, block_table, cache_seqlens, meta, num_splits)
    for n, t in zip(names, tensors):
        _check(isinstance(t, torch.Tensor), TypeError, lambda: f"{n}: expected a torch.Tensor, got {type(t).__name__}")
    for n, t in zip(names, tensors):
        _check(t.device == q.device, ValueError, lambda: f"{n}: expected device {q.device} (that of q), got {t.device}")
    _check(q.dim() == 4, ValueError, lambda: f"q: expected [batch, s_q, h_q, d], got shape {tuple(q.shape)}")
    _check(q.dtype in (torch.bfloat16, torch.float16), TypeError,
           lambda: f"q: expected bfloat16 or float16, got {q.dtype}")
    batch, s_q, h_q, d = q.shape
    _check(batch >= 1 and s_q >= 1 and h_q >= 1, ValueError, lambda: f"q: empty dimension in shape {tuple(q.shape)}")
    _check(q.is_contiguous(), ValueError, "q: must be contiguous")
    _check(k_cache.dim() == 4, ValueError,
           lambda: f"k_cache: expected [num_blocks, 64, h_kv, d], got shape {tuple(k_cache.shape)}")
    _check(k_cache.shape[1] == ref.PAGE_SIZE, ValueError,
           lambda: f"k_cache: page size (dim 1) must be {ref.PAGE_SIZE}, got {k_cache.shape[1]}")
    _check(k_cache.is_contiguous(), ValueError, "k_cache: must be contiguous")
    h_kv = k_cache.shape[2]
    _check(h_kv >= 1 and h_q % h_kv == 0, ValueError, lambda: f"k_cache: h_kv={h_kv} must divide h_q={h_q}")
    if is_fp8:
        _check(k_cache.dtype in (torch.uint8, torch.float8_e4m3fn), TypeError,
               lambda: f"k_cache: with is_fp8_kvcache=True expected uint8 (656-byte tokens), got {k_cache.dtype}")
        _check(k_cache.shape[3] == FP8_BYTES and d == 576 and head_dim_v == 512, ValueError,
               lambda: f"k_cache: FP8 cache needs d=576, head_dim_v=512 and {FP8_BYTES} bytes per token, got "
               f"d={d}, head_dim_v={head_dim_v}, {k_cache.shape[3]} bytes")
    else:
        _check(k_cache.dtype == q.dtype, TypeError,
               lambda: f"k_cache: expected {q.dtype} (dtype of q), got {k_cache.dtype}")
        _check(k_cache.shape[3] == d, ValueError, lambda: f"k_cache: head dim {k_cache.shape[3]} != q head dim {d}")
    _check(isinstance(head_dim_v, int) and 1 <= head_dim_v <= d, ValueError,
           lambda: f"head_dim_v: expected an int in [1, {d}], got {head_dim_v!r}")
    _check(block_table.dtype == torch.int32, TypeError, lambda: f"block_table: expected int32, got {block_table.dtype}")
    _check(block_table.dim() == 2 and block_table.shape[0] == batch, ValueError,
           lambda: f"block_table: expected [batch={batch}, max_blocks], got shape {tuple(block_table.shape)}")
    _check(block_table.stride(1) == 1, ValueError, "block_table: rows must be contiguous (stride(1) == 1)")
    _check(cache_seqlens.dtype == torch.int32, TypeError,
           lambda: f"cache_seqlens: expected int32, got {cache_seqlens.dtype}")
    _check(tuple(cache_seqlens.shape) == (batch,) and cache_seqlens.is_contiguous(), ValueError,
           lambda: f"cache_seqlens: expected contiguous [batch={batch}], got shape {tuple(cache_seqlens.shape)}")
    _check(meta.dtype == torch.int32 and meta.dim() == 2 and meta.shape[1] == ref.META_SIZE and meta.is_contiguous(),
           ValueError, lambda: f"tile_scheduler_metadata: expected contiguous int32 [num_sm_parts, 8], "
                               f"got {meta.dtype} {tuple(meta.shape)}")
    _check(num_splits.dtype == torch.int32 and tuple(num_splits.shape) == (batch + 1,) and num_splits.is_contiguous(),
           ValueError, lambda: f"num_splits: expected contiguous int32 [batch + 1 = {batch + 1}], "
                               f"got {num_splits.dtype} {tuple(num_splits.shape)}")
    # Value checks need the host (a sync); skipped while a CUDA graph is being captured, and for the tensor that
    # passed last time when it is unchanged (same object, same version counter: the layers of a decode step)
    cap = block_table.shape[1] * ref.PAGE_SIZE
    if not (q.is_cuda and torch.cuda.is_current_stream_capturing()) and not _seqlens_checked(cache_seqlens, cap):
        lo, hi = torch.aminmax(cache_seqlens)
        lo, hi = int(lo), int(hi)
        _check(lo >= 0, ValueError, lambda: f"cache_seqlens: must be >= 0, got min {lo}")
        _check(hi <= cap, ValueError,
               lambda: f"cache_seqlens: max {hi} exceeds the block table's capacity "
                       f"{block_table.shape[1]} pages x 64 = {cap}")
        if not cache_seqlens.is_inference():   # (inference tensors keep no version counter: checked every call)
            _last_checked[:] = [weakref.ref(cache_seqlens), cache_seqlens._version, cap]


_last_checked: list = [lambda: None, -1, -1]   # the cache_seqlens whose values passed last, its version, capacity


def _seqlens_checked(cache_seqlens: torch.Tensor, cap: int) -> bool:
    """True when cache_seqlens is the tensor whose values passed last, not written since (PyTorch bumps the
    version counter on every in-place write; a kernel writing through a raw pointer does not: see README)
    and checked against at most this capacity. (Only tensors with a version counter are ever recorded.)"""
    tensor, version, checked_cap = _last_checked
    return tensor() is cache_seqlens and version == cache_seqlens._version and cap >= checked_cap


def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                           cache_seqlens: torch.Tensor, head_dim_v: int,
                           tile_scheduler_metadata: torch.Tensor, num_splits: torch.Tensor,
                           softmax_scale: float | None = None, causal: bool = False,
                           is_fp8_kvcache: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA decoding attention over a paged KV cache.

    q:                       bf16/fp16 [batch, s_q, h_q, 576]
    k_cache:                 same dtype [num_blocks, 64, h_kv, 576]; V = k_cache[..., :head_dim_v];
                             with is_fp8_kvcache=True: uint8 [num_blocks, 64, h_kv, 656] (see quant.py)
    block_table:             int32 [batch, max_blocks], page ids (any order)
    cache_seqlens:           int32 [batch], 0 allowed
    head_dim_v:              512
    tile_scheduler_metadata, num_splits: from get_mla_metadata(cache_seqlens, s_q*h_q//h_kv, h_kv)
    softmax_scale:           default d ** -0.5
    causal:                  bottom-right aligned mask when s_q > 1
    Returns out [batch, s_q, h_q, head_dim_v] (dtype of q) and softmax_lse float32 [batch, h_q, s_q]
    (natural log). Requests or query rows with no key give out = 0, lse = +inf.
    """
    _validate(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
              bool(is_fp8_kvcache))
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    if not (isinstance(softmax_scale, (int, float)) and math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale: expected a positive finite float, got {softmax_scale!r}")
    if is_fp8_kvcache and k_cache.dtype != torch.uint8:
        k_cache = k_cache.view(torch.uint8)
    eager = not torch.compiler.is_compiling() and type(q) is torch.Tensor   # (fake and proxy tensors: subclasses)
    return (_decode_impl if eager else _decode_op)(q, k_cache, block_table, cache_seqlens, head_dim_v,
                                                   tile_scheduler_metadata, num_splits, float(softmax_scale),
                                                   bool(causal), bool(is_fp8_kvcache))
