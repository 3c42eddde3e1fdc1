"""Time FP8 GEMMs under forced block sizes (DEEPGEMM_BLOCKS) and multicast on/off, beside the cost model's
choice, to see where the model leaves speed on the table. GPU only; one device call:

    python deepgemm/scripts/tune_blocks.py [--budget 420] [--json PATH] [--shapes L:M:N:K:G,...] [--blocks BMxBN,...]

Shapes, most important first (the run stops at --budget seconds, keeping what it measured): the six
DeepSeek-V3 (N, K) pairs at M = 4096, 128 and 64, then masked 8 x 64 and 32 x 32 at (4096, 7168) and
(7168, 2048); --shapes replaces them (L: dense, masked or contiguous, M rows per group, G groups) and
--blocks the forced block sizes (default: every BM x BN of BMS x BNS). Each configuration is checked against
the reference before it is timed (diff < 1e-5).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_gemm import DENSE_NK, bench_contiguous, bench_dense, bench_masked  # noqa: E402

from deepgemm.jit import kernels  # noqa: E402

BMS, BNS = (64, 128), (48, 64, 96, 112, 128)


def measure(layout, m, n, k, groups):
    row = (bench_dense(m, n, k, with_ref=False, peers=False) if layout == "dense"
           else bench_contiguous(groups, m, n, k, peers=False) if layout == "contiguous"
           else bench_masked(groups, m, n, k, peers=False))
    return row["ours_tflops"] if row["diff"] < 1e-5 else float("nan")


def _config(layout, d, m, n, k, g):
    """The configuration a call of this shape gets (contiguous: one problem of G x M rows, as the API sees it)."""
    if layout == "contiguous":
        return kernels.make_config(layout, True, d, None, n, k, g * m, 1)
    return kernels.make_config(layout, True, d, None, n, k, m, g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=420.0, help="seconds; stops between configurations")
    ap.add_argument("--json", default=None)
    ap.add_argument("--shapes", default=None, help="L:M:N:K:G,... (L = dense, masked or contiguous; M per group)")
    ap.add_argument("--blocks", default=None, help="BMxBN,... to force (default: BMS x BNS)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("tune_blocks: needs a CUDA device")
        return 0
    t0 = time.time()
    shapes = [("dense", m, n, k, 1) for m in (4096, 128, 64) for n, k in DENSE_NK]
    shapes += [("masked", mg, n, k, g) for n, k in [(4096, 7168), (7168, 2048)] for g, mg in [(8, 64), (32, 32)]]
    if args.shapes:
        shapes = [(f[0], *map(int, f[1:])) for f in (s.split(":") for s in args.shapes.split(","))]
    blocks = ([tuple(map(int, b.lower().split("x"))) for b in args.blocks.split(",")] if args.blocks
              else list(itertools.product(BMS, BNS)))
    results = []
    for layout, m, n, k, g in shapes:
        for var in ("DEEPGEMM_BLOCKS", "DEEPGEMM_MULTICAST"):
            os.environ.pop(var, None)
        d = torch.empty(1, 1, dtype=torch.bfloat16)
        cfg = _config(layout, d, m, n, k, g)
        res = {"layout": layout, "m": m, "n": n, "k": k, "groups": g,
               "model": f"{cfg.bm}x{cfg.bn}", "model_tflops": measure(layout, m, n, k, g), "tried": {}}
        for (bm, bn), mc in itertools.product(blocks, os.environ.get("TUNE_MULTICAST", "0,1").split(",")):
            if time.time() - t0 > args.budget:
                break
            os.environ["DEEPGEMM_BLOCKS"], os.environ["DEEPGEMM_MULTICAST"] = f"{bm}x{bn}", mc
            eff = _config(layout, d, m, n, k, g)
            key = f"{bm}x{bn}" + (f" mcast{eff.mcast}" if eff.mcast else "")
            if key not in res["tried"]:
                res["tried"][key] = measure(layout, m, n, k, g)
        done = {c: v for c, v in res["tried"].items() if v == v}
        if done:
            best = max(done, key=done.get)
            res.update(best=best, best_tflops=done[best], gain=done[best] / res["model_tflops"])
            print(f"{layout:6s} M {m:5d} N {n:5d} K {k:5d} G {g:2d}: model {res['model']:7s} {res['model_tflops']:7.1f} "
                  f"TFLOPS | best {best:14s} {done[best]:7.1f} ({res['gain']:.2f}x)  [{len(done)} configs]", flush=True)
        results.append(res)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        if time.time() - t0 > args.budget:
            print(f"budget of {args.budget:.0f} s reached")
            break
    for var in ("DEEPGEMM_BLOCKS", "DEEPGEMM_MULTICAST"):
        os.environ.pop(var, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
