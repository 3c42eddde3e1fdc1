"""Plain-PyTorch oracle: the same stages composed sequentially over the same micro-batches."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .utils import scatter


def ref_step(stages: Sequence[nn.Module], inputs: Sequence[torch.Tensor], labels: Sequence[torch.Tensor],
             num_chunks: int, criterion: Optional[Callable], batch_dim: int = 0, backward: bool = True,
             ) -> Tuple[Optional[torch.Tensor], List[torch.Tensor]]:
    """Run ``num_chunks`` micro-batches through ``stages[0] -> ... -> stages[-1]``.

    inputs / labels: tensors whose ``batch_dim`` splits into ``num_chunks`` micro-batches.
    Returns (loss ``[num_chunks]`` or None, outputs: per-output-tensor concatenation). With
    ``backward`` each micro-batch's loss is back-propagated (grads accumulate in ``stages``).
    """
    losses, outs = [], []
    for x, y in zip(scatter(tuple(inputs), num_chunks, batch_dim), scatter(tuple(labels), num_chunks, batch_dim)):
        h = list(x)
        for stage in stages:
            h = stage(*h)
            h = [h] if isinstance(h, torch.Tensor) else list(h)
        outs.append(h)
        if criterion is not None:
            loss = criterion(*h, *y)
            if backward:
                loss.backward()
            losses.append(loss.detach())
    outputs = [torch.cat([o[i].detach() for o in outs], dim=batch_dim) for i in range(len(outs[0]))]
    return (torch.stack(losses) if losses else None), outputs
