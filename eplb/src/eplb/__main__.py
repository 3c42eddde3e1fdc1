"""`python -m eplb`: balance built-in Zipf-like loads and print imbalance before/after per policy
and option; `python -m eplb plan --load FILE --out plan.json|plan.pt` plans from your own loads."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from . import __version__, evaluate, plan_experts, redistribute_tokens
from .data import batch_tokens, zipf_load

# DeepSeek-V3 sizes: 256 routed experts in 8 groups, 58 MoE layers, EP32 (4 nodes x 8 GPUs), 288 slots
E, GROUPS, NODES, GPUS, SLOTS = 256, 8, 4, 32, 288


def _row(policy, option, m, moved="-", ms="-"):
    s = m.summary()
    print(f"{policy:13s} {option:18s} {s['imbalance']:12.3f} {s['node_imbalance']:13.3f} "
          f"{moved:>7} {ms:>9}")


def demo(args) -> None:
    w = zipf_load(args.layers, E, s=args.zipf, seed=args.seed)
    L = w.shape[0]
    print(f"eplb {__version__} (C++ core, CPU): Zipf s={args.zipf} load, {L} layers x {E} experts "
          f"-> {SLOTS} slots on {NODES} nodes x {GPUS // NODES} GPUs")
    print(f"{'policy':13s} {'option':18s} {'GPU max/mean':>12s} {'node max/mean':>13s} "
          f"{'moved':>7s} {'solve ms':>9s}")
    before = evaluate(w, torch.arange(E).repeat(L, 1), GPUS, NODES)
    _row("none", "(no replicas)", before)
    plans = {}
    for policy, groups in (("hierarchical", GROUPS), ("global", 1)):
        for option, kw in (("original greedy", {}), ("refine", {"refine": True}),
                           ("spread", {"spread": True}),
                           ("refine+spread", {"refine": True, "spread": True})):
            p = plan_experts(w, SLOTS, groups, NODES, GPUS, **kw)
            plans[policy, option] = p
            _row(policy, option, evaluate(w, p.phy2log, GPUS, NODES), ms=f"{1e3 * p.solve_time_s:.1f}")
    # migration: the load drifts; re-plan with and without the plan in use
    old = plans["hierarchical", "refine"].phy2log
    w2 = (w.double() * torch.exp(0.1 * torch.randn(w.shape, generator=torch.Generator().manual_seed(7),
                                                   dtype=torch.float64))).round().long()
    for option, kw in (("drift, fresh", {}), ("drift, previous", {"previous": old}),
                       ("drift, tol 5%", {"previous": old, "migration_tolerance": 0.05})):
        p = plan_experts(w2, SLOTS, GROUPS, NODES, GPUS, refine=True, **kw)
        m = evaluate(w2, p.phy2log, GPUS, NODES, previous=old)
        _row("hierarchical", option, m, moved=str(m.summary()["moved"]), ms=f"{1e3 * p.solve_time_s:.1f}")
    # per-batch token split (LPLB-style) on the refined plan
    best = plans["hierarchical", "refine"]
    tokens = batch_tokens(w, 16384, seed=args.seed + 1)
    even = evaluate(tokens, best.phy2log, GPUS, NODES)
    t0 = time.perf_counter()
    split = redistribute_tokens(best.phy2log, tokens, GPUS)
    lp_ms = 1e3 * (time.perf_counter() - t0)
    gpu = split.view(L, GPUS, -1).sum(-1).double()
    lp = (gpu.max(-1).values / gpu.mean(-1)).mean().item()
    print(f"one batch of 16384 tokens/layer on the refined plan: even split over replicas "
          f"{even.summary()['imbalance']:.3f} -> LP split {lp:.3f} ({lp_ms:.1f} ms)")
    if args.plot:
        plot(args.plot, w, before, evaluate(w, plans["hierarchical", "original greedy"].phy2log, GPUS, NODES),
             evaluate(w, best.phy2log, GPUS, NODES))
        print(f"wrote {args.plot}")
    b, g, r = (before.summary()["imbalance"],
               *(evaluate(w, plans["hierarchical", o].phy2log, GPUS, NODES).summary()["imbalance"]
                 for o in ("original greedy", "refine")))
    print(f"summary: backend=CPU result=imbalance {b:.2f} -> {g:.2f} greedy, {r:.2f} refine "
          f"({L} layers, {1e3 * best.solve_time_s:.0f} ms)")


def plot(path: str, w, *metrics) -> None:
    """Per-GPU load of the layer that is worst without balancing: before, greedy, refined."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    layer = int(metrics[0].imbalance.argmax())
    titles = ("no balancing", "EPLB greedy (original)", "EPLB refine")
    fig, axes = plt.subplots(1, 3, figsize=(12, 3), sharey=True)
    colors = [f"C{g * NODES // GPUS}" for g in range(GPUS)]
    for ax, m, title in zip(axes, metrics, titles):
        load = m.gpu_load[layer].numpy() / 1e3
        ax.bar(range(GPUS), load, color=colors)
        ax.axhline(load.mean(), color="k", lw=1, ls="--")
        ax.set_title(f"{title}: max/mean {m.imbalance[layer]:.2f}", fontsize=10)
        ax.set_xlabel("GPU (colour = node)")
    axes[0].set_ylabel(f"layer {layer} load (k tokens)")
    fig.tight_layout()
    fig.savefig(path, dpi=70)


def load_matrix(path: str) -> torch.Tensor:
    """Loads [L, E] from .csv (comma separated, no header), .npy or .pt."""
    suffix = Path(path).suffix
    if suffix == ".npy":
        return torch.from_numpy(np.load(path))
    if suffix == ".pt":
        return torch.load(path)
    if suffix == ".csv":
        return torch.from_numpy(np.loadtxt(path, delimiter=",", ndmin=2))
    raise ValueError(f"--load must be a .csv, .npy or .pt file, got {path!r}")


def plan_cmd(args) -> None:
    w = load_matrix(args.load)
    prev = None
    if args.previous:
        prev = (torch.tensor(json.loads(Path(args.previous).read_text())["phy2log"])
                if args.previous.endswith(".json") else torch.load(args.previous)["phy2log"])
    p = plan_experts(w, args.num_replicas, args.num_groups, args.num_nodes, args.num_gpus,
                     refine=args.refine, spread=args.spread, previous=prev)
    m = evaluate(w, p.phy2log, args.num_gpus, args.num_nodes, previous=prev)
    out = {"phy2log": p.phy2log, "log2phy": p.log2phy, "logcnt": p.logcnt}
    info = {**m.summary(), "solve_time_s": p.solve_time_s}
    if args.out.endswith(".pt"):
        torch.save({**out, "metrics": info}, args.out)
    elif args.out.endswith(".json"):
        Path(args.out).write_text(json.dumps({**{k: v.tolist() for k, v in out.items()}, "metrics": info}))
    else:
        raise ValueError(f"--out must end in .json or .pt, got {args.out!r}")
    print(f"wrote {args.out}: {tuple(w.shape)} loads -> {args.num_replicas} slots, "
          + ", ".join(f"{k} {v:.4g}" for k, v in info.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eplb", description=__doc__)
    ap.add_argument("--version", action="version", version=f"eplb {__version__}")
    ap.add_argument("--layers", type=int, default=58, help="layers of built-in data (58)")
    ap.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of built-in data (1.0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", metavar="FILE.png", help="draw per-GPU load before/after")
    sub = ap.add_subparsers(dest="cmd")
    pp = sub.add_parser("plan", help="plan from a CSV/NPY/PT load matrix [layers, experts]")
    pp.add_argument("--load", required=True)
    pp.add_argument("--out", default="plan.json", help="plan.json or plan.pt")
    pp.add_argument("--num-replicas", type=int, default=SLOTS)
    pp.add_argument("--num-groups", type=int, default=GROUPS)
    pp.add_argument("--num-nodes", type=int, default=NODES)
    pp.add_argument("--num-gpus", type=int, default=GPUS)
    pp.add_argument("--refine", action="store_true")
    pp.add_argument("--spread", action="store_true")
    pp.add_argument("--previous", help="plan file (.json/.pt) in use, for migration-aware planning")
    args = ap.parse_args(argv)
    try:
        plan_cmd(args) if args.cmd == "plan" else demo(args)
    except (ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
