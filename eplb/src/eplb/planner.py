"""Public API: validate inputs, call the C++ core, wrap results in torch tensors, measure plans."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from . import _C


def _check_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_matrix(name: str, t, what: str, integer: bool = False) -> torch.Tensor:
    """2-D tensor check; a 1-D tensor is not accepted here (callers unsqueeze where allowed)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D {what}, got shape {tuple(t.shape)}")
    bad = t.dtype in (torch.bool, torch.complex64, torch.complex128) or (integer and t.is_floating_point())
    if bad:
        kind = "an integer" if integer else "a real"
        raise TypeError(f"{name} must have {kind} dtype, got {t.dtype}")
    return t.detach().cpu()


def _check_weight(weight) -> torch.Tensor:
    w = _check_matrix("weight", weight, "[layers, num_logical_experts]").double()
    if w.shape[1] == 0:
        raise ValueError("weight must have at least one expert, got shape (L, 0)")
    if not torch.isfinite(w).all():
        raise ValueError("weight must be finite, got NaN or inf loads")
    if (w < 0).any():
        raise ValueError(f"weight must be non-negative, got minimum {w.min().item()}")
    return w


def _check_plan(name: str, phy2log, layers: int, num_replicas: int, num_experts: int,
                cover: bool = True) -> torch.Tensor:
    p = _check_matrix(name, phy2log, "[layers, num_replicas]", integer=True).long()
    if p.shape != (layers, num_replicas):
        raise ValueError(f"{name} must have shape {(layers, num_replicas)}, got {tuple(p.shape)}")
    if p.numel() and (p.min() < 0 or p.max() >= num_experts):
        raise ValueError(f"{name} entries must be expert ids in [0, {num_experts}), "
                         f"got range [{p.min().item()}, {p.max().item()}]")
    if cover and layers:
        cnt = torch.zeros(layers, num_experts, dtype=torch.long).scatter_add_(1, p, torch.ones_like(p))
        if (cnt == 0).any():
            raise ValueError(f"{name} must give every logical expert at least one slot")
    return p


def _check_shape_args(E: int, num_replicas, num_groups, num_nodes, num_gpus) -> tuple[int, ...]:
    R = _check_int("num_replicas", num_replicas)
    groups = _check_int("num_groups", num_groups)
    nodes = _check_int("num_nodes", num_nodes)
    gpus = _check_int("num_gpus", num_gpus)
    if R < E:
        raise ValueError(f"num_replicas must be >= num_logical_experts ({E}), got {R}")
    if R % gpus:
        raise ValueError(f"num_replicas must be a multiple of num_gpus ({gpus}), got {R}")
    if gpus % nodes:
        raise ValueError(f"num_gpus must be a multiple of num_nodes ({nodes}), got {gpus}")
    if groups % nodes == 0 and E % groups:  # the global policy ignores groups
        raise ValueError(f"num_groups must divide num_logical_experts ({E}), got {groups}")
    return R, groups, nodes, gpus


@dataclass
class Plan:
    """A placement for every layer, as the original returns it, plus how long it took.

    phy2log: [L, R] int64, logical expert held by each physical slot (slot // (R / num_gpus) is
    its GPU); log2phy: [L, E, max_replicas] int64, slots of each expert, -1 padded; logcnt: [L, E]
    int64, replicas per expert; solve_time_s: wall time of the solve; moved: [L] int64 slots whose
    expert differs from ``previous`` (None when no previous plan was given).
    """
    phy2log: torch.Tensor
    log2phy: torch.Tensor
    logcnt: torch.Tensor
    solve_time_s: float
    moved: torch.Tensor | None = None


def plan_experts(weight: torch.Tensor, num_replicas: int, num_groups: int, num_nodes: int,
                 num_gpus: int, *, refine: bool = False, spread: bool = False,
                 previous: torch.Tensor | None = None, migration_tolerance: float = 0.0) -> Plan:
    """:func:`rebalance_experts` returning a :class:`Plan` (with the solve time)."""
    w = _check_weight(weight)
    L, E = w.shape
    R, groups, nodes, gpus = _check_shape_args(E, num_replicas, num_groups, num_nodes, num_gpus)
    prev = None if previous is None else _check_plan("previous", previous, L, R, E).numpy()
    if not isinstance(migration_tolerance, (int, float)) or not migration_tolerance >= 0:
        raise ValueError(f"migration_tolerance must be a number >= 0, got {migration_tolerance!r}")
    t0 = time.perf_counter()
    out = _C.rebalance(w.numpy(), R, groups, nodes, gpus, bool(refine), bool(spread),
                       float(migration_tolerance), prev)
    plan = Plan(*map(torch.from_numpy, out), time.perf_counter() - t0)
    if prev is not None:
        plan.moved = (plan.phy2log != torch.from_numpy(prev)).sum(-1)
    return plan


def rebalance_experts(weight: torch.Tensor, num_replicas: int, num_groups: int, num_nodes: int,
                      num_gpus: int, *, refine: bool = False, spread: bool = False,
                      previous: torch.Tensor | None = None, migration_tolerance: float = 0.0
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plans which logical experts each GPU holds, replicating the hot ones, for every layer.

    Hierarchical policy when num_groups % num_nodes == 0 (groups -> nodes, replicas within each
    node, replicas -> the node's GPUs), else the global policy (one group on one node).

    weight: [L, E] float or int load statistics (finite, >= 0), any device.
    num_replicas: R physical slots, a multiple of num_gpus and >= E.
    num_groups: expert groups (E % num_groups == 0); num_nodes: server nodes; num_gpus: GPUs,
        a multiple of num_nodes.
    refine: improve the greedy packing by pair swaps; per layer it keeps the better plan, so the
        max GPU load is never above the original's.
    spread: put replicas of one expert on different GPUs (and, under the global policy, nodes)
        whenever there is room.
    previous: [L, R] int64 phy2log of the plan in use. Per layer the result is whichever of
        (a) the previous plan, (b) the previous plan repaired (new replica counts, survivors keep
        their slots, swaps to balance) and (c) the new plan renumbered to keep as many slots as
        possible moves the fewest expert weights while its max GPU load stays within
        (1 + migration_tolerance) of (c)'s.
    Returns phy2log [L, R], log2phy [L, E, max_replicas] (-1 padded) and logcnt [L, E], int64 on
    the CPU.
    """
    p = plan_experts(weight, num_replicas, num_groups, num_nodes, num_gpus, refine=refine,
                     spread=spread, previous=previous, migration_tolerance=migration_tolerance)
    return p.phy2log, p.log2phy, p.logcnt


def redistribute_tokens(phy2log: torch.Tensor, tokens: torch.Tensor, num_gpus: int) -> torch.Tensor:
    """LPLB-style per-batch split: how many of each expert's tokens go to each of its replicas.

    Minimises the most loaded GPU exactly (in integers) for one batch: the LP "split t_e over the
    replicas of e, minimise max GPU load" is solved by max-flow plus a binary search on the load.

    phy2log: [L, R] (or [R]) int plan; tokens: [L, E] (or [E]) int tokens each logical expert got.
    Returns [L, R] (or [R]) int64 tokens per slot; they sum to tokens[l, e] over e's slots.
    """
    squeeze = isinstance(phy2log, torch.Tensor) and phy2log.dim() == 1
    if squeeze:
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1:
            raise ValueError("tokens must be 1-D [E] when phy2log is 1-D [R]")
        phy2log, tokens = phy2log.unsqueeze(0), tokens.unsqueeze(0)
    t = _check_matrix("tokens", tokens, "[layers, num_logical_experts]", integer=True).long()
    if (t < 0).any():
        raise ValueError(f"tokens must be non-negative, got minimum {t.min().item()}")
    L, E = t.shape
    if not isinstance(phy2log, torch.Tensor) or phy2log.dim() != 2:
        raise ValueError("phy2log must be a 2-D tensor [layers, num_replicas]")
    R = phy2log.shape[1]
    gpus = _check_int("num_gpus", num_gpus)
    if R % gpus:
        raise ValueError(f"phy2log's num_replicas ({R}) must be a multiple of num_gpus ({gpus})")
    p = _check_plan("phy2log", phy2log, L, R, E)
    out = torch.from_numpy(_C.redistribute(p.numpy(), t.numpy(), gpus))
    return out[0] if squeeze else out


@dataclass
class Metrics:
    """Balance of a plan. Tensors are per layer; load of a slot = load of its expert / replicas.

    gpu_load: [L, G] float64; node_load: [L, N] float64; imbalance: [L] max/mean GPU load;
    node_imbalance: [L] max/mean node load; moved: [L] int64 slots whose expert changed from the
    previous plan (None without one).
    """
    gpu_load: torch.Tensor
    node_load: torch.Tensor
    imbalance: torch.Tensor
    node_imbalance: torch.Tensor
    moved: torch.Tensor | None = None

    def summary(self) -> dict:
        """Means over layers, and the total slots moved."""
        out = {"imbalance": self.imbalance.mean().item(),
               "node_imbalance": self.node_imbalance.mean().item(),
               "max_imbalance": self.imbalance.max().item()}
        if self.moved is not None:
            out["moved"] = int(self.moved.sum())
        return out


def _ratio(load: torch.Tensor) -> torch.Tensor:
    mean = load.mean(-1)
    return torch.where(mean > 0, load.max(-1).values / mean.clamp(min=1e-300), torch.ones_like(mean))


def evaluate(weight: torch.Tensor, phy2log: torch.Tensor, num_gpus: int, num_nodes: int = 1,
             previous: torch.Tensor | None = None) -> Metrics:
    """Metrics of a plan for loads ``weight`` [L, E]; ``phy2log`` [L, R] with R % num_gpus == 0.

    For "before" numbers pass the identity placement, e.g. ``torch.arange(E).repeat(L, 1)``.
    """
    w = _check_weight(weight)
    L, E = w.shape
    gpus, nodes = _check_int("num_gpus", num_gpus), _check_int("num_nodes", num_nodes)
    R = phy2log.shape[-1] if isinstance(phy2log, torch.Tensor) and phy2log.dim() == 2 else -1
    if R < 0 or R % gpus or gpus % nodes:
        raise ValueError(f"phy2log must be [L, R] with R a multiple of num_gpus ({gpus}) and "
                         f"num_gpus a multiple of num_nodes ({nodes}), got "
                         f"{tuple(getattr(phy2log, 'shape', ()))}")
    p = _check_plan("phy2log", phy2log, L, R, E, cover=False)
    cnt = torch.zeros(L, E, dtype=torch.float64).scatter_add_(1, p, torch.ones(L, R, dtype=torch.float64))
    gpu_load = (w / cnt.clamp(min=1)).gather(1, p).view(L, gpus, R // gpus).sum(-1)
    node_load = gpu_load.view(L, nodes, gpus // nodes).sum(-1)
    moved = None
    if previous is not None:
        moved = (p != _check_plan("previous", previous, L, R, E, cover=False)).sum(-1)
    return Metrics(gpu_load, node_load, _ratio(gpu_load), _ratio(node_load), moved)
