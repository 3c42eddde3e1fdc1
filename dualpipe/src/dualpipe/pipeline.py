"""The runtime shared by DualPipe and DualPipeV: it executes the native planner's op list.

Each rank holds two stages ("phases" 0 and 1, i.e. ``self.module[0]`` and ``self.module[1]``).
The planner (``dualpipe._C``) gives, for this rank, the ordered ops F / B / W / FB and the p2p
posts + COMMITs; the topology gives, per phase, where its inputs come from and its outputs go:
another rank (p2p), the other phase of this rank (the turn of DualPipeV's V), or nothing (the
first stage reads the user's inputs, the last stage applies the criterion).
"""
from __future__ import annotations

import zlib
from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn as nn

from . import _C, comm
from .schedule import B, COMMIT, F, FB, RECV_B, RECV_F, SEND_B, SEND_F, W, plan
from .utils import WeightGradStore, gather, run_backward, scatter

Tensors = List[torch.Tensor]


class PipelineBase(nn.Module):
    """Common machinery; subclasses set ``KIND`` and ``_micro_batches_per_source``."""

    KIND = ""

    def __init__(self, modules: Tuple[nn.Module, nn.Module], batch_dim: int = 0,
                 process_group: Optional[dist.ProcessGroup] = None, rank_mapping: Optional[List[int]] = None) -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(modules, (tuple, list, nn.ModuleList)) or len(modules) != 2 or \
                not all(isinstance(m, nn.Module) for m in modules):
            raise TypeError(f"{name}: modules must be a pair (module0, module1) of nn.Module, got {_describe(modules)}")
        if not isinstance(batch_dim, int):
            raise TypeError(f"{name}: batch_dim must be an int, got {batch_dim!r}")
        if not dist.is_initialized():
            raise RuntimeError(f"{name}: torch.distributed is not initialized (call init_process_group first)")
        self.module = nn.ModuleList(modules)
        self.overlapped_forward_backward = type(modules[0]) == type(modules[1]) and \
            hasattr(type(modules[0]), "overlapped_forward_backward")
        self.batch_dim = batch_dim
        self.group = process_group or dist.distributed_c10d._get_default_group()
        self.num_ranks = self.group.size()
        if rank_mapping is None:
            rank_mapping = list(range(self.num_ranks))
        if sorted(rank_mapping) != list(range(self.num_ranks)):
            raise ValueError(f"{name}: rank_mapping must be a permutation of range({self.num_ranks}), got {rank_mapping}")
        self.rank_mapping = list(rank_mapping)
        self.rank_inverse_mapping: List[Optional[int]] = [None] * (self.num_ranks + 1)
        for group_rank, pipe_rank in enumerate(self.rank_mapping):
            self.rank_inverse_mapping[pipe_rank] = group_rank
        self.rank = self.rank_mapping[self.group.rank()]
        self.prev_rank = self.rank_inverse_mapping[self.rank - 1]
        self.next_rank = self.rank_inverse_mapping[self.rank + 1]
        self.is_first_rank = self.rank == 0
        self.is_last_rank = self.rank == self.num_ranks - 1
        self._check_num_ranks()

        params = [p for m in self.module for p in m.parameters()]
        self.device = params[0].device if params else torch.device("cpu")
        if self.device.type == "cuda" and self.device.index != torch.cuda.current_device():
            raise ValueError(f"{name}: modules live on {self.device} but the current CUDA device is "
                             f"cuda:{torch.cuda.current_device()}; call torch.cuda.set_device first")

        # roles of the two local stages, from the planner's topology
        topo = _C.topology(self.KIND, self.num_ranks)
        self._src: List[Optional[int]] = []    # group rank feeding phase p (None: user input / local)
        self._dst: List[Optional[int]] = []    # group rank phase p sends to (None: criterion / local)
        self._local_next: List[Optional[int]] = []  # phase fed locally by phase p
        self._local_prev: List[Optional[int]] = []
        self._is_first_stage: List[bool] = []
        self._is_last_stage: List[bool] = []
        for p in range(2):
            i = self.rank * 2 + p
            prv, nxt = topo["prev"][i], topo["next"][i]
            self._is_first_stage.append(prv < 0)
            self._is_last_stage.append(nxt < 0)
            self._local_prev.append(prv % 2 if prv >= 0 and prv // 2 == self.rank else None)
            self._local_next.append(nxt % 2 if nxt >= 0 and nxt // 2 == self.rank else None)
            self._src.append(self.rank_inverse_mapping[prv // 2] if prv >= 0 and prv // 2 != self.rank else None)
            self._dst.append(self.rank_inverse_mapping[nxt // 2] if nxt >= 0 and nxt // 2 != self.rank else None)
        self._plans = {}
        self.trace: Optional[List[Tuple[int, ...]]] = None  # set to [] to record executed ops
        self._reset_states()

    # ---- overridden by DualPipe / DualPipeV -------------------------------------------------
    def _check_num_ranks(self) -> None:
        pass

    def _check_num_chunks(self, num_chunks: int) -> Optional[str]:
        raise NotImplementedError

    def _micro_batches_per_source(self, num_chunks: int) -> int:
        raise NotImplementedError

    # ---- p2p shape/dtype (same as the module-level functions) -------------------------------
    @staticmethod
    def set_p2p_tensor_shapes(shapes) -> None:
        comm.set_p2p_tensor_shapes(shapes)

    @staticmethod
    def set_p2p_tensor_dtype(dtype: torch.dtype) -> None:
        comm.set_p2p_tensor_dtype(dtype)

    # ---- the step ---------------------------------------------------------------------------
    def step(self, *inputs: Optional[torch.Tensor], num_chunks: int = 0, criterion: Optional[Callable] = None,
             labels: Sequence[Optional[torch.Tensor]] = [], return_outputs: bool = False,
             ) -> Tuple[Optional[torch.Tensor], Optional[Union[torch.Tensor, Tuple[torch.Tensor, ...]]]]:
        """Run one training (or, under ``torch.no_grad()``, inference) step. See the subclass docstring."""
        self.forward_only = not torch.is_grad_enabled()
        self.return_outputs = return_outputs
        self._validate_step(inputs, num_chunks, criterion, labels)

        self._reset_states()
        n = self._micro_batches_per_source(num_chunks)
        for p in range(2):
            if self._is_first_stage[p]:
                self.input_chunks[p].extend(list(mb) for mb in scatter(inputs, n, self.batch_dim))
            if self._is_last_stage[p]:
                self.labels[p].extend(scatter(labels, n, self.batch_dim))
        self.criterion = criterion

        key = (num_chunks, self.forward_only)
        if key not in self._plans:
            self._plans[key] = plan(self.KIND, self.num_ranks, num_chunks, rank=self.rank,
                                    forward_only=self.forward_only)[0]
        for row in self._plans[key]:
            self._execute(row)
        if not WeightGradStore.funcs_queue.empty() or self.comm_ops:
            raise RuntimeError(f"{type(self).__name__}: plan left queued weight grads or uncommitted p2p ops")

        loss, outputs = None, None
        sink = [p for p in range(2) if self._is_last_stage[p]]
        if sink:
            if criterion is not None:
                loss = torch.stack(self.loss_chunks)
            if return_outputs:
                outputs = gather(self.output_chunks[sink[0]], self.batch_dim)
                if len(outputs) == 1:
                    outputs = outputs[0]
        self._reset_states()
        return loss, outputs

    # ---- validation: every rank raises, before any p2p --------------------------------------
    def _validate_step(self, inputs, num_chunks, criterion, labels) -> None:
        name = f"{type(self).__name__}.step"
        err = None
        if comm.TENSOR_SHAPES is None or comm.TENSOR_DTYPE is None:
            err = f"{name}: call set_p2p_tensor_shapes and set_p2p_tensor_dtype before doing a step"
        elif not isinstance(num_chunks, int) or isinstance(num_chunks, bool):
            err = f"{name}: num_chunks must be an int, got {num_chunks!r}"
        else:
            err = self._check_num_chunks(num_chunks)
        if err is None:
            err = self._check_local_data(name, inputs, num_chunks, criterion, labels)
        # agree across ranks: any local error, or different num_chunks / p2p signature / mode
        sig = zlib.crc32(repr((comm.TENSOR_SHAPES, str(comm.TENSOR_DTYPE))).encode()) & 0x7FFFFFFF
        vals = [num_chunks if isinstance(num_chunks, int) else -1, sig, int(self.forward_only)]
        t = torch.tensor(vals + [-v for v in vals] + [self.group.rank() + 1 if err else 0],
                         dtype=torch.int64, device=self._collective_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        t = t.tolist()
        k = len(vals)
        if err is not None:
            raise ValueError(err)
        if t[-1]:
            raise ValueError(f"{name}: group rank {t[-1] - 1} rejected its arguments (see its error); "
                             "no p2p communication was started")
        what = ("num_chunks", "p2p tensor shapes/dtype", "grad mode (torch.no_grad on some ranks only)")
        for i in range(k):
            if t[i] != -t[k + i]:
                raise ValueError(f"{name}: {what[i]} differs between ranks (this rank: "
                                 f"{[num_chunks, (comm.TENSOR_SHAPES, comm.TENSOR_DTYPE), self.forward_only][i]})")

    def _collective_device(self) -> torch.device:
        backend = dist.get_backend(self.group)
        return self.device if "nccl" in str(backend) else torch.device("cpu")

    def _check_local_data(self, name, inputs, num_chunks, criterion, labels) -> Optional[str]:
        n = self._micro_batches_per_source(num_chunks)
        if any(self._is_first_stage):
            if len(inputs) == 0 or all(x is None for x in inputs):
                return f"{name}: inputs are required on pipeline rank {self.rank} (it holds a first stage)"
            for i, x in enumerate(inputs):
                if x is not None and not isinstance(x, torch.Tensor):
                    return f"{name}: inputs[{i}] must be a torch.Tensor or None, got {type(x).__name__}"
                if x is not None and (x.dim() <= self.batch_dim or x.shape[self.batch_dim] % n != 0):
                    return (f"{name}: inputs[{i}] of shape {tuple(x.shape)} does not split into {n} equal "
                            f"micro-batches along batch_dim={self.batch_dim}")
        if any(self._is_last_stage):
            if not self.forward_only and criterion is None:
                return f"{name}: criterion is required for training on pipeline rank {self.rank} (it holds a last stage)"
            if criterion is not None and not callable(criterion):
                return f"{name}: criterion must be callable, got {type(criterion).__name__}"
            labels = (labels,) if isinstance(labels, torch.Tensor) else labels
            for i, x in enumerate(labels):
                if x is not None and not isinstance(x, torch.Tensor):
                    return f"{name}: labels[{i}] must be a torch.Tensor or None, got {type(x).__name__}"
                if x is not None and (x.dim() <= self.batch_dim or x.shape[self.batch_dim] % n != 0):
                    return (f"{name}: labels[{i}] of shape {tuple(x.shape)} does not split into {n} equal "
                            f"micro-batches along batch_dim={self.batch_dim}")
        return None

    # ---- state --------------------------------------------------------------------------------
    def _reset_states(self) -> None:
        WeightGradStore.clear()
        self.input_chunks: Tuple[List[Tensors], List[Tensors]] = ([], [])
        self.output_chunks: Tuple[List[Tensors], List[Tensors]] = ([], [])
        self.input_grad_chunks: Tuple[List[Tensors], List[Tensors]] = ([], [])
        self.output_grad_chunks: Tuple[List[Tensors], List[Tensors]] = ([], [])
        self.labels: Tuple[list, list] = ([], [])
        self.loss_chunks: List[torch.Tensor] = []
        self.criterion: Optional[Callable] = None
        self.current_f_chunk_id = [0, 0]
        self.current_b_chunk_id = [0, 0]
        self.current_send_f_chunk_id = [0, 0]
        self.current_send_b_chunk_id = [0, 0]
        self.current_recv_f_chunk_id = [0, 0]
        self.current_recv_b_chunk_id = [0, 0]
        self.comm_ops: List[dist.P2POp] = []
        self.to_free: List[torch.Tensor] = []
        self._deferred: List[Tuple[int, int]] = []  # (phase, chunk) of queued weight-grad groups

    # ---- op dispatch --------------------------------------------------------------------------
    def _execute(self, row) -> None:
        kind, zb, p, c, p1, c1 = row
        if kind == F:
            got = self._forward_compute_chunk(p)
        elif kind == B:
            got = self._backward_compute_chunk(p, bool(zb))
        elif kind == FB:
            got = self._forward_backward_compute_chunk(p, p1)
        elif kind == W:
            got = self._weight_chunk()
        elif kind == RECV_F:
            got = self._recv_forward(p)
        elif kind == RECV_B:
            got = self._recv_backward(p)
        elif kind == SEND_F:
            got = self._send_forward(p)
        elif kind == SEND_B:
            got = self._send_backward(p)
        elif kind == COMMIT:
            got = self._commit_and_wait_comm()
        else:
            raise RuntimeError(f"unknown op kind {kind}")
        if self.trace is not None:
            self.trace.append(got)

    # ---- compute ------------------------------------------------------------------------------
    def _forward_compute_chunk(self, phase: int):
        chunk_id = self.current_f_chunk_id[phase]
        self.current_f_chunk_id[phase] += 1
        inputs = self.input_chunks[phase][chunk_id]
        if self.forward_only:
            self.input_chunks[phase][chunk_id] = None
        outputs = self.module[phase](*inputs)
        outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
        self._post_forward(phase, chunk_id, outputs, None, compute_loss=True)
        return (F, 0, phase, chunk_id, -1, -1)

    def _post_forward(self, phase: int, chunk_id: int, outputs: Tensors, loss, compute_loss: bool) -> None:
        last = self._is_last_stage[phase]
        if last and self.criterion is not None:
            if compute_loss:
                loss = self.criterion(*outputs, *self.labels[phase][chunk_id])
            self.loss_chunks.append(loss)
        nxt = self._local_next[phase]
        if nxt is not None:  # the turn of the V: this rank's next stage takes the outputs directly
            self.input_chunks[nxt].append([o.detach().requires_grad_(o.is_floating_point()) for o in outputs])
        if not last or self.return_outputs:
            self.output_chunks[phase].append(outputs)

    def _pre_backward(self, phase: int):
        """Take what the backward of the next micro-batch of ``phase`` needs: (chunk, loss, outputs, grads)."""
        chunk_id = self.current_b_chunk_id[phase]
        self.current_b_chunk_id[phase] += 1
        if self._is_last_stage[phase]:
            return chunk_id, self.loss_chunks[chunk_id], [], []
        outputs = self.output_chunks[phase][chunk_id]
        if not self.return_outputs:
            self.output_chunks[phase][chunk_id] = None
        grads = self.output_grad_chunks[phase][chunk_id]
        self.output_grad_chunks[phase][chunk_id] = None
        pairs = [(t, g) for t, g in zip(outputs, grads) if g is not None]
        return chunk_id, None, [t for t, _ in pairs], [g for _, g in pairs]

    def _post_backward(self, phase: int, chunk_id: int) -> None:
        inputs = self.input_chunks[phase][chunk_id]
        self.input_chunks[phase][chunk_id] = None
        grads = [t.grad if isinstance(t, torch.Tensor) else None for t in inputs]
        prv = self._local_prev[phase]
        if prv is not None:
            self.output_grad_chunks[prv].append(grads)
        else:
            self.input_grad_chunks[phase].append(grads)

    def _backward_compute_chunk(self, phase: int, enable_zb: bool = False):
        chunk_id, loss, outputs, grads = self._pre_backward(phase)
        WeightGradStore.enabled = enable_zb
        try:
            if loss is not None:
                loss.backward()
                loss.detach_()
            elif outputs:
                run_backward(outputs, grads)
        finally:
            WeightGradStore.enabled = False
        if enable_zb:
            WeightGradStore.flush()
            self._deferred.append((phase, chunk_id))
        self._post_backward(phase, chunk_id)
        return (B, int(enable_zb), phase, chunk_id, -1, -1)

    def _forward_backward_compute_chunk(self, phase0: int, phase1: int):
        if not self.overlapped_forward_backward:
            _, _, _, c0, _, _ = self._forward_compute_chunk(phase0)
            _, _, _, c1, _, _ = self._backward_compute_chunk(phase1)
            return (FB, 0, phase0, c0, phase1, c1)
        # pre-forward
        chunk_id0 = self.current_f_chunk_id[phase0]
        self.current_f_chunk_id[phase0] += 1
        module0 = self.module[phase0]
        inputs0 = self.input_chunks[phase0][chunk_id0]
        with_loss = self._is_last_stage[phase0] and self.criterion is not None
        criterion0 = self.criterion if with_loss else None
        labels0 = self.labels[phase0][chunk_id0] if with_loss else []
        # pre-backward
        chunk_id1, loss1, outputs1, grads1 = self._pre_backward(phase1)
        # forward & backward, overlapped by the model's hook
        outputs0, loss0 = type(module0).overlapped_forward_backward(
            module0, inputs0, criterion0, labels0, self.module[phase1], loss1, outputs1, grads1)
        outputs0 = [outputs0] if isinstance(outputs0, torch.Tensor) else list(outputs0)
        self._post_forward(phase0, chunk_id0, outputs0, loss0, compute_loss=False)
        self._post_backward(phase1, chunk_id1)
        return (FB, 0, phase0, chunk_id0, phase1, chunk_id1)

    def _weight_chunk(self):
        WeightGradStore.pop()  # FIFO: the oldest deferred backward
        phase, chunk_id = self._deferred.pop(0)
        return (W, 0, phase, chunk_id, -1, -1)

    # ---- p2p ----------------------------------------------------------------------------------
    def _recv_forward(self, phase: int):
        src = self._src[phase]
        if src is None:
            raise RuntimeError(f"plan error: RECV_F on phase {phase} of pipeline rank {self.rank}")
        chunk_id = self.current_recv_f_chunk_id[phase]
        self.current_recv_f_chunk_id[phase] += 1
        self.input_chunks[phase].append(comm.append_irecv(self.comm_ops, src, self.group, self.device))
        return (RECV_F, 0, phase, chunk_id, -1, -1)

    def _send_forward(self, phase: int):
        dst = self._dst[phase]
        if dst is None:
            raise RuntimeError(f"plan error: SEND_F on phase {phase} of pipeline rank {self.rank}")
        chunk_id = self.current_send_f_chunk_id[phase]
        self.current_send_f_chunk_id[phase] += 1
        tensors = self.output_chunks[phase][chunk_id]
        comm.check_tensors(tensors, f"{type(self).__name__}: outputs of stage (rank {self.rank}, phase {phase})")
        comm.append_isend(self.comm_ops, tensors, dst, self.group)
        if not self.return_outputs:
            self.to_free.extend(tensors)
        return (SEND_F, 0, phase, chunk_id, -1, -1)

    def _recv_backward(self, phase: int):
        dst = self._dst[phase]
        if dst is None:
            raise RuntimeError(f"plan error: RECV_B on phase {phase} of pipeline rank {self.rank}")
        chunk_id = self.current_recv_b_chunk_id[phase]
        self.current_recv_b_chunk_id[phase] += 1
        self.output_grad_chunks[phase].append(comm.append_irecv(self.comm_ops, dst, self.group, self.device))
        return (RECV_B, 0, phase, chunk_id, -1, -1)

    def _send_backward(self, phase: int):
        src = self._src[phase]
        if src is None:
            raise RuntimeError(f"plan error: SEND_B on phase {phase} of pipeline rank {self.rank}")
        chunk_id = self.current_send_b_chunk_id[phase]
        self.current_send_b_chunk_id[phase] += 1
        grads = self.input_grad_chunks[phase][chunk_id]
        self.input_grad_chunks[phase][chunk_id] = None
        # an input the stage did not use gets a zero gradient (the peer waits for every tensor)
        inputs_like = comm.TENSOR_SHAPES
        grads = [g if g is not None else torch.zeros(s, dtype=comm.TENSOR_DTYPE, device=self.device)
                 for g, s in zip(grads, inputs_like)]
        comm.append_isend(self.comm_ops, grads, src, self.group)
        return (SEND_B, 0, phase, chunk_id, -1, -1)

    def _commit_and_wait_comm(self):
        if not self.comm_ops:
            raise RuntimeError("plan error: COMMIT with nothing pending")
        for req in dist.batch_isend_irecv(self.comm_ops):
            req.wait()
        self.comm_ops = []
        self._free_tensors()
        return (COMMIT, 0, -1, -1, -1, -1)

    def _free_tensors(self) -> None:
        # sent activations are only needed for their autograd graph: release their storage
        for t in self.to_free:
            if t._base is not None:
                raise ValueError(f"{type(self).__name__}: a pipeline stage returned a view tensor "
                                 f"(shape {tuple(t.shape)}); return a fresh tensor, e.g. x.clone()")
            t.data = torch.Tensor()
        self.to_free = []


def _describe(x) -> str:
    if isinstance(x, (tuple, list)):
        return f"{type(x).__name__} of {len(x)} ({', '.join(type(m).__name__ for m in x)})"
    return type(x).__name__
