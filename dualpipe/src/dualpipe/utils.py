"""Helpers shared by the runtime: WeightGradStore, run_backward, micro-batch scatter/gather."""
from __future__ import annotations

import queue
from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
from torch.autograd import Variable


class WeightGradStore:
    """Defers weight-gradient work (zero-bubble style).

    A custom autograd function calls ``WeightGradStore.put(fn)`` from its backward when
    ``WeightGradStore.enabled`` is True instead of computing the weight gradient at once. The
    runtime sets ``enabled`` around a backward with ``enable_zb``, then ``flush()`` groups the
    queued closures of that backward, and a later ``W`` op runs the oldest group with ``pop()``.
    """

    enabled: bool = False
    cache: List[Callable[[], None]] = []
    funcs_queue: "queue.Queue[List[Callable[[], None]]]" = queue.Queue()

    @classmethod
    def put(cls, func: Callable[[], None]) -> None:
        cls.cache.append(func)

    @classmethod
    def flush(cls) -> None:
        cls.funcs_queue.put(cls.cache)
        cls.cache = []

    @classmethod
    def pop(cls) -> None:
        if cls.funcs_queue.empty():
            raise RuntimeError("WeightGradStore.pop: no queued weight-gradient group")
        for func in cls.funcs_queue.get():
            func()

    @classmethod
    def clear(cls) -> None:
        cls.cache = []
        cls.funcs_queue = queue.Queue()


def run_backward(tensors: Sequence[torch.Tensor], grad_tensors: Sequence[torch.Tensor]) -> None:
    """Backward from ``tensors`` seeded with ``grad_tensors`` (same shapes), accumulating into .grad.

    Calls the autograd engine directly so that ``tensors`` whose storage was already released
    (sent activations) can still seed the backward.
    """
    Variable._execution_engine.run_backward(
        tuple(tensors), tuple(grad_tensors), keep_graph=False, create_graph=False,
        inputs=(), allow_unreachable=True, accumulate_grad=True)


def chunk_tensor(x: Optional[torch.Tensor], chunks: int, dim: int) -> List[Optional[torch.Tensor]]:
    if x is None:
        return [None] * chunks
    return list(x.tensor_split(chunks, dim=dim))


def cat_tensor(x: Sequence[Optional[torch.Tensor]], dim: int) -> Optional[torch.Tensor]:
    if len(x) == 0 or x[0] is None:
        return None
    return torch.cat(list(x), dim=dim)


def scatter(inputs: Union[torch.Tensor, Sequence[Optional[torch.Tensor]]], chunks: int, dim: int
            ) -> List[Tuple[Optional[torch.Tensor], ...]]:
    """Split each tensor of ``inputs`` into ``chunks`` micro-batches along ``dim``.

    Returns ``chunks`` tuples, micro-batch i holding the i-th piece of every input.
    """
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    pieces = [chunk_tensor(x, chunks, dim) for x in inputs]
    micro = [tuple(mb) for mb in zip(*pieces)]
    return micro if micro else [() for _ in range(chunks)]


def gather(micro_outputs: Sequence[Union[torch.Tensor, Sequence[torch.Tensor]]], dim: int
           ) -> Tuple[Optional[torch.Tensor], ...]:
    """Inverse of :func:`scatter`: concatenate per-micro-batch outputs along ``dim``."""
    if isinstance(micro_outputs[0], torch.Tensor):
        micro_outputs = [(x,) for x in micro_outputs]
    return tuple(cat_tensor(list(x), dim) for x in zip(*micro_outputs))
