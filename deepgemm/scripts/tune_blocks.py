"""Time FP8 GEMMs under forced block sizes (DEEPGEMM_BLOCKS), split-K slice counts (DEEPGEMM_SPLIT_K) and
multicast on/off, beside the cost model's choice, to see where the model leaves speed on the table. GPU only;
one device call:

    python deepgemm/scripts/tune_blocks.py [--budget 420] [--json PATH] [--shapes L:M:N:K:G,...] [--blocks BMxBN,...]
        [--splits S,...] [--confirm N]

Shapes, most important first (the run stops at --budget seconds, keeping what it measured): the six
DeepSeek-V3 (N, K) pairs at M = 4096, 128 and 64, then masked 8 x 64 and 32 x 32 at (4096, 7168) and
(7168, 2048); --shapes replaces them (L: dense, masked or contiguous, M rows per group, G groups) and
--blocks the forced block sizes (default: every BM x BN of BMS x BNS). Each configuration is checked against
the reference before it is timed (diff < 1e-5). --splits (dense, M <= 128) times every block size under each
slice count (0: no split, forced) but those of more than one wave of units; without it the split is left to auto. --confirm N times the model's choice and
the N best configurations again in N + 1 alternating rounds and keeps each one's best, so that a gain is not one
round's noise.
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
from deepgemm.utils import ceil_div  # noqa: E402

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
    ap.add_argument("--splits", default=None, help="S,... split-K slice counts to force (0: none; default: auto)")
    ap.add_argument("--confirm", type=int, default=0, help="re-time the model's pick and the N best")
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
    splits = args.splits.split(",") if args.splits else [None]
    tuned = ("DEEPGEMM_BLOCKS", "DEEPGEMM_MULTICAST", "DEEPGEMM_SPLIT_K")

    def set_env(settings):
        for var in tuned:
            os.environ.pop(var, None)
        os.environ.update({var: v for var, v in settings.items() if v is not None})

    results = []
    for layout, m, n, k, g in shapes:
        set_env({})
        d = torch.empty(1, 1, dtype=torch.bfloat16)
        cfg = _config(layout, d, m, n, k, g)
        res = {"layout": layout, "m": m, "n": n, "k": k, "groups": g,
               "model": f"{cfg.bm}x{cfg.bn}" + (f" s{cfg.splitk}" if cfg.splitk else ""),
               "model_tflops": measure(layout, m, n, k, g), "tried": {}}
        envs = {}
        for (bm, bn), mc, sk in itertools.product(blocks, os.environ.get("TUNE_MULTICAST", "0,1").split(","), splits):
            if time.time() - t0 > args.budget:
                break
            settings = {"DEEPGEMM_BLOCKS": f"{bm}x{bn}", "DEEPGEMM_MULTICAST": mc, "DEEPGEMM_SPLIT_K": sk}
            set_env(settings)
            try:
                eff = _config(layout, d, m, n, k, g)
            except ValueError:  # e.g. a split of a width split-K does not take
                continue
            units = ceil_div(m, eff.bm) * ceil_div(n, eff.bn) * max(eff.splitk, 1)
            if eff.splitk and units > kernels.get_num_sms() or (layout == "dense" and m <= 64 < eff.bm):
                continue  # more than one wave of split units, or half the tile past M
            key = f"{eff.bm}x{eff.bn}" + (f" s{eff.splitk}" if eff.splitk else "") + (f" mcast{eff.mcast}" if eff.mcast else "")
            if key not in res["tried"]:
                envs[key] = settings
                res["tried"][key] = measure(layout, m, n, k, g)
        done = {c: v for c, v in res["tried"].items() if v == v}
        if done and args.confirm and time.time() - t0 < args.budget:
            top = sorted(done, key=done.get, reverse=True)[:args.confirm]
            for _ in range(args.confirm + 1):
                set_env({})
                res["model_tflops"] = max(res["model_tflops"], measure(layout, m, n, k, g))
                for c in top:
                    set_env(envs[c])
                    done[c] = max(done[c], measure(layout, m, n, k, g))
            res["tried"].update(done)
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
    set_env({})
    return 0


if __name__ == "__main__":
    sys.exit(main())
