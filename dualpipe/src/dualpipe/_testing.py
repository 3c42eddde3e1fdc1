"""Multi-process harness shared by the tests, ``python -m dualpipe run`` and the benchmarks.

Tiny MLP stages (one linear layer that defers its weight grad through WeightGradStore, one plain
nn.Linear) are run through DualPipe / DualPipeV and checked against ``ref.ref_step``: on CPU with
gloo (float64 by default), or one process per GPU with NCCL (``backend="nccl"``, any dtype).
"""
from __future__ import annotations

import copy
import json
import os
import socket
import traceback
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as Fn

from .utils import WeightGradStore, run_backward


class _ZBLinear(torch.autograd.Function):
    """y = x @ w.T whose weight grad is deferred to WeightGradStore when it is enabled."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors

        def weight_grad():
            gw = g.flatten(0, -2).t() @ x.flatten(0, -2)
            w.grad = gw if w.grad is None else w.grad + gw

        if WeightGradStore.enabled:
            WeightGradStore.put(weight_grad)
        else:
            weight_grad()
        return g @ w, None


class MLPStage(nn.Module):
    """x [mb, hidden] -> tanh(x @ w1.T) -> Linear -> [mb, hidden]."""

    def __init__(self, hidden: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(hidden, hidden) / hidden ** 0.5)
        self.lin2 = nn.Linear(hidden, hidden)

    def forward(self, x):
        return self.lin2(torch.tanh(_ZBLinear.apply(x, self.w1)))


class MLPStageOverlap(MLPStage):
    """Same stage with the overlapped_forward_backward hook (forward of one chunk, backward of another)."""

    @classmethod
    def overlapped_forward_backward(cls, module0, inputs0, criterion0, labels0, module1, loss1, outputs1, output_grads1):
        outputs0 = module0(*inputs0)
        outputs0 = [outputs0] if isinstance(outputs0, torch.Tensor) else outputs0
        loss0 = criterion0(*outputs0, *labels0) if criterion0 is not None else None
        if loss1 is not None:
            loss1.backward()
            loss1.detach_()
        else:
            run_backward(outputs1, output_grads1)
        return outputs0, loss0


def criterion(out, target):
    return Fn.mse_loss(out, target)


def run_ranks(target, world: int, args_of, timeout_s: float, daemon: bool = False):
    """Spawns `world` processes running target(*args_of(rank)), waits for all of them within one
    deadline of timeout_s seconds and kills those still running. Returns (processes, hung ranks)."""
    import multiprocessing as mp
    import time
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=args_of(r), daemon=daemon) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    return procs, hung


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# NVLink multicast (NVLS) must stay off on the shared GPU hosts: a program using it can take the
# host's GPUs out of service. Forced on in every NCCL process this package starts.
SAFE_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def init(rank: int, world: int, port: int, timeout_s: float = 60.0, backend: str = "gloo") -> None:
    """Join a ``world``-process group on 127.0.0.1:``port``.

    ``backend="nccl"``: one GPU per process (``cuda:rank``), NVLink multicast off, TF32 off (so
    float32 results are true float32 and can be compared to 1e-6).
    """
    import datetime
    torch.set_num_threads(1)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"init: backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl":
        os.environ.update(SAFE_NCCL_ENV)
        torch.cuda.set_device(rank)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def default_device() -> torch.device:
    """The device of this process's pipeline stages: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and "nccl" in str(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    if a.shape != b.shape:
        return float("inf")
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def check_case(kind: str, num_chunks: int, overlap: bool, return_outputs: bool, forward_only: bool = False,
               hidden: int = 8, mb: int = 2, seed: int = 0, group=None, rank_mapping=None,
               trace: bool = False, dtype: str = "float64") -> Dict[str, float]:
    """Run one step of ``kind`` on the current process group and compare with the oracle.

    ``dtype`` ("float64", "float32", "bfloat16"): of the stages, inputs and p2p tensors; the oracle
    runs the same stages in the same dtype on the same device (this rank's GPU under NCCL).
    Errors are max |a - b| / max |b|, computed in float64.
    Returns max relative errors {"loss", "outputs", "grads"} seen on this rank (0 where n/a),
    plus "trace_ok" (1.0/0.0) when ``trace``.
    """
    from . import DualPipe, DualPipeV, set_p2p_tensor_dtype, set_p2p_tensor_shapes
    from .ref import ref_step
    from .schedule import plan

    group = group or dist.distributed_c10d._get_default_group()
    P, grank = group.size(), group.rank()
    mapping = rank_mapping or list(range(P))
    r = mapping[grank]
    n_stages = P if kind == "DualPipe" else 2 * P
    cls = MLPStageOverlap if overlap else MLPStage
    dt, dev = getattr(torch, dtype), default_device()
    torch.manual_seed(seed)  # the same values on every rank and device: drawn on the CPU, then moved
    stages = nn.ModuleList([cls(hidden) for _ in range(n_stages)]).to(device=dev, dtype=dt)
    x = torch.randn(num_chunks * mb, hidden, dtype=torch.float64).to(device=dev, dtype=dt)
    y = torch.randn(num_chunks * mb, hidden, dtype=torch.float64).to(device=dev, dtype=dt)

    set_p2p_tensor_shapes([(mb, hidden)])
    set_p2p_tensor_dtype(dt)
    if kind == "DualPipe":
        local = (copy.deepcopy(stages[r]), copy.deepcopy(stages[P - 1 - r]))
        model = DualPipe(local, process_group=group, rank_mapping=rank_mapping)
        xs, ys = x.chunk(2), y.chunk(2)
        inp = (xs[0],) if r == 0 else ((xs[1],) if r == P - 1 else ())
        lab = (ys[1],) if r == 0 else ((ys[0],) if r == P - 1 else ())
    else:
        local = (copy.deepcopy(stages[r]), copy.deepcopy(stages[2 * P - 1 - r]))
        model = DualPipeV(local, process_group=group, rank_mapping=rank_mapping)
        inp, lab = ((x,), (y,)) if r == 0 else ((), ())
    if trace:
        model.trace = []
    poison = torch.full((1,), float("nan"), device=dev)
    loss, outputs = poison, poison
    with torch.set_grad_enabled(not forward_only):
        loss, outputs = model.step(*inp, num_chunks=num_chunks, criterion=criterion, labels=lab,
                                   return_outputs=return_outputs)
    ref_loss, ref_out = ref_step(stages, (x,), (y,), num_chunks, criterion, backward=not forward_only)

    res = {"loss": 0.0, "outputs": 0.0, "grads": 0.0}
    half = num_chunks // 2
    if kind == "DualPipe" and r in (0, P - 1):
        sl = slice(half, None) if r == 0 else slice(0, half)
        rows = slice(half * mb, None) if r == 0 else slice(0, half * mb)
        res["loss"] = rel_err(loss, ref_loss[sl])
        res["outputs"] = rel_err(outputs, ref_out[0][rows]) if return_outputs else float(outputs is not None)
    elif kind == "DualPipeV" and r == 0:
        res["loss"] = rel_err(loss, ref_loss)
        res["outputs"] = rel_err(outputs, ref_out[0]) if return_outputs else float(outputs is not None)
    else:
        res["loss"] = float(loss is not None)
        res["outputs"] = float(outputs is not None)

    if not forward_only:
        mine = [[p.grad for p in m.parameters()] for m in model.module]
        if kind == "DualPipe":  # the two copies of each stage: sum their grads over the group
            flat = torch.cat([g.flatten() for gs in mine for g in gs]).double()  # summed in float64
            allg = [torch.empty_like(flat) for _ in range(P)]
            dist.all_gather(allg, flat, group=group)
            by_rank = [None] * P
            for g_rank, t in enumerate(allg):
                by_rank[mapping[g_rank]] = t
            n0 = sum(g.numel() for g in mine[0])
            total = by_rank[r][:n0] + by_rank[P - 1 - r][n0:]
            ref = torch.cat([p.grad.flatten() for p in stages[r].parameters()]).double()
            res["grads"] = rel_err(total, ref)
        else:
            errs = []
            for m_idx, s_idx in ((0, r), (1, 2 * P - 1 - r)):
                for g, p in zip(mine[m_idx], stages[s_idx].parameters()):
                    errs.append(rel_err(g, p.grad))
            res["grads"] = max(errs)
    if trace:
        expected = plan(kind, P, num_chunks, rank=r, forward_only=forward_only)[0]
        res["trace_ok"] = float(model.trace == expected)
    return res


def _worker(rank: int, world: int, port: int, cases: List[dict], out_dir: str, backend: str = "gloo") -> None:
    out = {"rank": rank, "results": [], "error": None}
    try:
        init(rank, world, port, backend=backend)
        for case in cases:
            case = dict(case)
            sub = case.pop("subgroup", None)
            group = None
            if sub is not None:  # every rank must create every group; only members run the case
                group = dist.new_group(sub)
                if rank not in sub:
                    out["results"].append(None)
                    continue
            if case.pop("expect_error", False):
                out["results"].append(_expect_error(case, group))
                continue
            out["results"].append(check_case(group=group, **case))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # reported to the parent
        out["error"] = traceback.format_exc()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


def _expect_error(case: dict, group) -> dict:
    """Run a bad-input case; report the exception type and message seen on this rank."""
    try:
        bad_step(group=group, **case)
    except (ValueError, TypeError) as e:
        return {"raised": type(e).__name__, "message": str(e)}
    return {"raised": None, "message": ""}


def bad_step(what: str, kind: str = "DualPipeV", group=None) -> None:
    """Construct / step a pipeline with one kind of bad input (see tests/test_bad_input.py)."""
    from . import DualPipe, DualPipeV, set_p2p_tensor_dtype, set_p2p_tensor_shapes
    group = group or dist.distributed_c10d._get_default_group()
    P, r = group.size(), group.rank()
    cls = DualPipe if kind == "DualPipe" else DualPipeV
    hidden, mb = 4, 2
    set_p2p_tensor_shapes([(mb, hidden)])
    set_p2p_tensor_dtype(torch.float64)
    mods = (MLPStage(hidden).double(), MLPStage(hidden).double())
    if what == "modules":
        cls((mods[0],), process_group=group)
    if what == "modules_type":
        cls((mods[0], "not a module"), process_group=group)
    if what == "odd_ranks":
        DualPipe(mods, process_group=group)
    model = cls(mods, process_group=group)
    n = 2 * P
    first = r == 0 or (kind == "DualPipe" and r == P - 1)
    x = torch.randn(n * mb, hidden, dtype=torch.float64)
    kw = dict(num_chunks=n, criterion=criterion, labels=(x,))
    if what == "num_chunks_small":
        kw["num_chunks"] = n - 2
    elif what == "num_chunks_odd":
        kw["num_chunks"] = n + 1
    elif what == "batch_split":
        x = torch.randn(n * mb + (1 if r == 0 else 0), hidden, dtype=torch.float64)
    elif what == "p2p_shape":
        if r == P - 1:
            set_p2p_tensor_shapes([(mb, hidden + 1)])
    elif what == "p2p_dtype":
        if r == 0:
            set_p2p_tensor_dtype(torch.float32)
    elif what == "num_chunks_mismatch":
        if r == 1:
            kw["num_chunks"] = n + 2
    elif what == "no_criterion":
        kw["criterion"] = None
    model.step(*((x,) if first else ()), **kw)


def launch(world: int, cases: List[dict], timeout_s: float = 180.0, backend: str = "gloo") -> List[dict]:
    """Spawn ``world`` processes on 127.0.0.1 (a fresh free port) running ``cases``.

    backend: "gloo" (CPU) or "nccl" (process r on GPU r; needs ``world`` CUDA devices).
    Returns each rank's {"rank", "results", "error"}; raises if a process hangs or dies.
    """
    if backend == "nccl":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < world:
            raise ValueError(f"launch: backend='nccl' with world={world} needs {world} CUDA devices, found {n}")
        os.environ.update(SAFE_NCCL_ENV)  # inherited by the spawned processes too
    import tempfile
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        procs, hung = run_ranks(_worker, world, lambda r: (r, world, port, cases, d, backend), timeout_s, daemon=True)
        if hung:
            raise TimeoutError(f"ranks {hung} of {world} did not finish within {timeout_s} s")
        outs = []
        for r in range(world):
            path = os.path.join(d, f"rank{r}.json")
            if not os.path.exists(path):
                raise RuntimeError(f"rank {r} exited with code {procs[r].exitcode} without a result")
            with open(path) as f:
                outs.append(json.load(f))
    return outs


def gpu_smoke(port: int, num_chunks: int = 4, hidden: int = 16, mb: int = 4) -> Dict[str, float]:
    """1-rank DualPipeV on CUDA over NCCL, stepped on a side stream; max rel errors vs the oracle.

    The oracle runs on the default stream after the step; agreement (float64) shows the step's
    work is ordered on the stream it was issued on.
    """
    import datetime
    from . import DualPipeV, set_p2p_tensor_dtype, set_p2p_tensor_shapes
    from .ref import ref_step
    os.environ.update(SAFE_NCCL_ENV)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    dev = torch.device("cuda", 0)
    out = {}
    try:
        for overlap in (False, True):
            cls = MLPStageOverlap if overlap else MLPStage
            torch.manual_seed(1)
            stages = nn.ModuleList([cls(hidden) for _ in range(2)]).double().to(dev)
            model = DualPipeV((copy.deepcopy(stages[0]), copy.deepcopy(stages[1])))
            set_p2p_tensor_shapes([(mb, hidden)])
            set_p2p_tensor_dtype(torch.float64)
            x = torch.randn(num_chunks * mb, hidden, dtype=torch.float64, device=dev)
            y = torch.randn(num_chunks * mb, hidden, dtype=torch.float64, device=dev)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loss, outputs = model.step(x, num_chunks=num_chunks, criterion=criterion, labels=(y,),
                                           return_outputs=True)
                with torch.no_grad():
                    loss_i, _ = model.step(x, num_chunks=num_chunks, criterion=criterion, labels=(y,))
            torch.cuda.current_stream().wait_stream(side)
            ref_loss, ref_out = ref_step(stages, (x,), (y,), num_chunks, criterion)
            g = max(rel_err(a.grad, b.grad) for m, s in zip(model.module, stages)
                    for a, b in zip(m.parameters(), s.parameters()))
            out[f"overlap={overlap}"] = max(rel_err(loss, ref_loss), rel_err(outputs, ref_out[0]), g,
                                            rel_err(loss_i, ref_loss))
    finally:
        dist.destroy_process_group()
    return out
