"""Point-to-point helpers: the p2p tensor shapes/dtype and batched isend/irecv op lists.

Every activation (and its gradient) exchanged between pipeline stages has the shapes set by
:func:`set_p2p_tensor_shapes` and the dtype set by :func:`set_p2p_tensor_dtype`, on every rank.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

TENSOR_SHAPES: Optional[List[Tuple[int, ...]]] = None
TENSOR_DTYPE: Optional[torch.dtype] = None


def set_p2p_tensor_shapes(shapes: Sequence[Sequence[int]]) -> None:
    """Shapes of the tensors one stage sends to the next, e.g. ``[(micro_batch, seq, hidden)]``."""
    global TENSOR_SHAPES
    if isinstance(shapes, (str, bytes)) or not isinstance(shapes, (list, tuple)) or len(shapes) == 0:
        raise TypeError(f"set_p2p_tensor_shapes: shapes must be a non-empty list of shapes, got {shapes!r}")
    out = []
    for s in shapes:
        if isinstance(s, torch.Size):
            s = tuple(s)
        if not isinstance(s, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in s):
            raise TypeError(f"set_p2p_tensor_shapes: each shape must be a tuple of ints >= 0, got {s!r}")
        out.append(tuple(int(d) for d in s))
    TENSOR_SHAPES = out


def set_p2p_tensor_dtype(dtype: torch.dtype) -> None:
    """Dtype of every tensor exchanged between stages, e.g. ``torch.bfloat16``."""
    global TENSOR_DTYPE
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"set_p2p_tensor_dtype: dtype must be a torch.dtype, got {dtype!r}")
    TENSOR_DTYPE = dtype


def build_from_tensor_shapes(device: torch.device) -> List[torch.Tensor]:
    """Fresh receive buffers (requires_grad so that backward fills their .grad)."""
    return [torch.empty(s, dtype=TENSOR_DTYPE, device=device, requires_grad=True) for s in TENSOR_SHAPES]


def check_tensors(tensors: Sequence[torch.Tensor], what: str) -> None:
    """Raise if ``tensors`` do not match the declared p2p shapes/dtype (before they are sent)."""
    shapes = [tuple(t.shape) for t in tensors]
    dtypes = {t.dtype for t in tensors}
    if shapes != list(TENSOR_SHAPES) or dtypes != {TENSOR_DTYPE}:
        raise ValueError(f"{what}: tensors to send have shapes {shapes} and dtypes {sorted(map(str, dtypes))}, "
                         f"but set_p2p_tensor_shapes/dtype declared {TENSOR_SHAPES} and {TENSOR_DTYPE}")


def append_irecv(ops: List[dist.P2POp], src: int, group: dist.ProcessGroup, device: torch.device
                 ) -> List[torch.Tensor]:
    """Append irecvs from group rank ``src`` into fresh buffers; return the buffers."""
    tensors = build_from_tensor_shapes(device)
    peer = dist.get_global_rank(group, src)
    for t in tensors:
        ops.append(dist.P2POp(dist.irecv, t, peer, group))
    return tensors


def append_isend(ops: List[dist.P2POp], tensors: Sequence[torch.Tensor], dst: int, group: dist.ProcessGroup) -> None:
    """Append isends of ``tensors`` to group rank ``dst``."""
    peer = dist.get_global_rank(group, dst)
    for t in tensors:
        if t is not None:
            ops.append(dist.P2POp(dist.isend, t, peer, group))
