"""Imbalance and solve time: plain-PyTorch greedy reference vs our C++ greedy vs C++ refine.

DeepSeek-V3 sizes (256 routed experts in 8 groups, 58 MoE layers) under four load shapes and
four expert-parallel sizes. Imbalance = max/mean GPU load, averaged over layers.

    python eplb/benchmarks/bench_eplb.py [--json out.json] [--layers 58] [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

import eplb
from eplb import ref
from eplb.data import zipf_load

# name: (GPUs, nodes, physical slots); groups=8, so EP144/EP256 use the global policy
EP = {"EP32": (32, 4, 288), "EP64": (64, 8, 320), "EP144": (144, 18, 288), "EP256": (256, 32, 512)}


def loads(kind: str, layers: int) -> torch.Tensor:
    if kind == "uniform":
        return zipf_load(layers, 256, s=0.0, noise=0.1, seed=1)
    if kind == "hot expert":  # uniform, plus one expert per layer taking 30% of the tokens
        w = zipf_load(layers, 256, s=0.0, noise=0.1, seed=2).double()
        hot = torch.randint(0, 256, (layers,), generator=torch.Generator().manual_seed(3))
        w[torch.arange(layers), hot] = 0.3 / 0.7 * w.sum(-1)
        return w.round().long()
    s = float(kind.split("=")[1])
    return zipf_load(layers, 256, s=s, seed=4 + int(10 * s))


def timed(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--layers", type=int, default=58)
    ap.add_argument("--repeat", type=int, default=11, help="runs per C++ timing (median)")
    args = ap.parse_args()
    rows = []
    ref.rebalance_experts(torch.rand(2, 16), 32, 4, 2, 8)  # warm up torch before timing
    hdr = ("| load | EP | policy | ref greedy imb | C++ greedy imb | refine imb | excess kept | "
           "ref ms | C++ ms | speed-up | refine ms |")
    print(hdr)
    print("|" + "---|" * hdr.count(" | ") + "---|")
    for kind in ("uniform", "zipf s=1.0", "zipf s=1.5", "hot expert"):
        w = loads(kind, args.layers)
        for ep, (gpus, nodes, slots) in EP.items():
            a = (w, slots, 8, nodes, gpus)
            r, t_ref = timed(lambda: ref.rebalance_experts(*a), 1)
            g, t_cpp = timed(lambda: eplb.rebalance_experts(*a), args.repeat)
            f, t_ref_ms = timed(lambda: eplb.rebalance_experts(*a, refine=True), max(1, args.repeat // 2))
            assert all(torch.equal(x, y) for x, y in zip(r, g)), "C++ greedy differs from reference"
            imb = [eplb.evaluate(w, p[0], gpus, nodes).imbalance.mean().item() for p in (r, g, f)]
            row = {"load": kind, "ep": ep, "policy": "hierarchical" if 8 % nodes == 0 else "global",
                   "layers": args.layers, "slots": slots, "imbalance_ref": imb[0],
                   "imbalance_cpp": imb[1], "imbalance_refine": imb[2],
                   "excess_kept": (imb[2] - 1) / (imb[1] - 1) if imb[1] > 1 else 1.0,
                   "ms_ref": 1e3 * t_ref, "ms_cpp": 1e3 * t_cpp, "speedup": t_ref / t_cpp,
                   "ms_refine": 1e3 * t_ref_ms}
            rows.append(row)
            print(f"| {kind} | {ep} | {row['policy']} | {imb[0]:.4f} | {imb[1]:.4f} | {imb[2]:.4f} | "
                  f"{row['excess_kept']:.2f} | {row['ms_ref']:.0f} | {row['ms_cpp']:.2f} | "
                  f"{row['speedup']:.0f}x | {row['ms_refine']:.0f} |")
    worse = sum(r["imbalance_refine"] > r["imbalance_cpp"] * (1 + 1e-12) for r in rows)
    mean_kept = statistics.mean(r["excess_kept"] for r in rows)
    v3 = next(r for r in rows if r["ep"] == "EP32" and r["load"] == "zipf s=1.0")
    print(f"refine above greedy in {worse} of {len(rows)} cases; mean share of greedy's excess "
          f"imbalance left by refine: {mean_kept:.2f}; V3 EP32 zipf speed-up {v3['speedup']:.0f}x")
    if args.json:
        meta = {"device": platform.processor() or platform.machine(), "torch": torch.__version__,
                "eplb": eplb.__version__, "threads": torch.get_num_threads()}
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
