"""Python face of the native planner and simulator (``dualpipe._C``).

Schedules: ``"1F1B"``, ``"interleaved"`` (interleaved 1F1B, ``virtual_stages`` per rank),
``"ZB1P"`` (zero-bubble H1), ``"ZBV"`` (zero-bubble V), ``"DualPipe"``, ``"DualPipeV"``.
``num_chunks`` is the number of micro-batches of one step (for DualPipe: both ends together).

An op list row is ``(kind, zb, phase, chunk, phase1, chunk1)``; ``phase`` is the local stage
(module index) an op works on, ``chunk`` the micro-batch id within that phase (-1: n/a);
``phase1``/``chunk1`` are the backward half of an ``FB`` op.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from . import _C

F, B, W, FB, RECV_F, RECV_B, SEND_F, SEND_B, COMMIT = range(9)
OP_NAMES = ("F", "B", "W", "FB", "RECV_F", "RECV_B", "SEND_F", "SEND_B", "COMMIT")
SCHEDULES = ("1F1B", "interleaved", "ZB1P", "ZBV", "DualPipe", "DualPipeV")

Row = Tuple[int, int, int, int, int, int]


def plan(kind: str, num_ranks: int, num_chunks: int, rank: Optional[int] = None,
         forward_only: bool = False, virtual_stages: int = 2) -> List[List[Row]]:
    """Per-rank op lists (all ranks, or only ``rank``) as lists of row tuples."""
    arrays = _C.plan(kind, int(num_ranks), int(num_chunks), -1 if rank is None else int(rank),
                     bool(forward_only), int(virtual_stages))
    return [[tuple(r) for r in a.tolist()] for a in arrays]


def format_ops(rows: List[Row]) -> str:
    """Compact text of an op list, e.g. ``F0.3 COMMIT B1.2zb W``."""
    out = []
    for k, zb, p, c, p1, c1 in rows:
        if k == COMMIT:
            out.append("|")
        elif k == FB:
            out.append(f"F{p}.{c}&B{p1}.{c1}")
        elif k == W:
            out.append("W")
        else:
            out.append(f"{OP_NAMES[k]}{p}.{c}{'zb' if zb else ''}")
    return " ".join(out)


@dataclass
class SimResult:
    """Simulated step. Times are in the unit of the costs; per-rank arrays have ``num_ranks`` entries.

    bubble[r] = makespan - busy[r] (idle time of rank r during the step);
    peak_activations[r] counts live (forwarded, not yet backwarded) stage-micro-batches;
    peak_activation_memory = peak_activations * stage_fraction, in units of one micro-batch's
    activations over a rank's share (layers / ranks) of the model.
    """
    kind: str
    num_ranks: int
    num_chunks: int
    makespan: float
    busy: np.ndarray
    end: np.ndarray
    peak_activations: np.ndarray
    stage_fraction: float
    num_ops: int
    plan_seconds: float
    simulate_seconds: float
    timeline: Optional[Dict[str, np.ndarray]] = field(default=None, repr=False)

    @property
    def bubble(self) -> np.ndarray:
        return self.makespan - self.busy

    @property
    def bubble_ratio(self) -> float:
        """Idle fraction of all rank-time: sum(bubble) / (ranks * makespan)."""
        return float(self.bubble.sum() / (self.num_ranks * self.makespan))

    @property
    def peak_activation_memory(self) -> np.ndarray:
        return self.peak_activations * self.stage_fraction


def simulate(kind: str, num_ranks: int, num_chunks: int, F: float = 1.0, B: float = 2.0, W: float = 1.0,
             FB: Optional[float] = None, p2p: float = 0.0, virtual_stages: int = 2,
             timeline: bool = False, commit: float = 0.0) -> SimResult:
    """Plan ``kind`` and simulate it with per-stage op costs.

    F: forward of one micro-batch through one stage; B: its full backward (input + weight grad);
    W: the weight-grad part of B (run separately by zero-bubble ops); FB: an overlapped forward +
    backward pair (default F + B, i.e. no overlap gain); p2p: latency of one activation transfer;
    commit: time a rank spends issuing one batch of p2p ops (idle time, not busy).
    """
    fb = F + B if FB is None else FB
    d = _C.simulate(kind, int(num_ranks), int(num_chunks), F=float(F), B=float(B), W=float(W), FB=float(fb),
                    p2p=float(p2p), commit=float(commit), virtual_stages=int(virtual_stages),
                    timeline=bool(timeline))
    return SimResult(kind=kind, num_ranks=int(num_ranks), num_chunks=int(num_chunks), makespan=d["makespan"],
                     busy=d["busy"], end=d["end"], peak_activations=d["peak_activations"],
                     stage_fraction=d["stage_fraction"], num_ops=d["num_ops"], plan_seconds=d["plan_seconds"],
                     simulate_seconds=d["simulate_seconds"], timeline=d.get("timeline"))


def compare(num_ranks: int, num_chunks: int, F: float = 1.0, B: float = 2.0, W: float = 1.0,
            FB: Optional[float] = None, p2p: float = 0.0, kinds=SCHEDULES, virtual_stages: int = 2,
            timeline: bool = False) -> Dict[str, SimResult]:
    """Simulate several schedules for the same model split over ``num_ranks`` ranks.

    Costs are for one rank's share of the model (layers / ranks); schedules whose stages are
    smaller (V shapes: half, interleaved: 1/virtual_stages) get proportionally smaller costs.
    """
    out = {}
    fb = F + B if FB is None else FB
    for kind in kinds:
        frac = 0.5 if kind in ("ZBV", "DualPipeV") else (1.0 / virtual_stages if kind == "interleaved" else 1.0)
        out[kind] = simulate(kind, num_ranks, num_chunks, F * frac, B * frac, W * frac, fb * frac, p2p,
                             virtual_stages, timeline)
    return out
