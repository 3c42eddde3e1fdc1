"""Time FP8 GEMMs under a few named configurations each (environment settings such as DEEPGEMM_BLOCKS and
DEEPGEMM_SPLIT_K), in alternating rounds, keeping each configuration's best; for checking a change of the
block or split choice against the picks it replaces. GPU only; one device call:

    python deepgemm/scripts/compare_picks.py CASES.json [--rounds 3] [--json OUT.json]

CASES.json: a list of {"layout": "dense" | "contiguous" | "masked", "m": M (per group), "n": N, "k": K, "groups": G,
"configs": {"name": {"DEEPGEMM_BLOCKS": "128x64", "DEEPGEMM_SPLIT_K": "0"}, ...}}. Prints TFLOPS per
configuration (checked against the reference first: NaN if it differs) and each one's ratio to the first.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from tune_blocks import measure as time_layout  # (this script's folder is on sys.path)

KNOBS = ("DEEPGEMM_BLOCKS", "DEEPGEMM_SPLIT_K", "DEEPGEMM_GEMV", "DEEPGEMM_MULTICAST", "DEEPGEMM_PIPE", "DEEPGEMM_KSPLIT",
         "DEEPGEMM_PEEL", "DEEPGEMM_STAGES", "DEEPGEMM_SFA_ONCE", "DEEPGEMM_PDL", "DEEPGEMM_MIN_SMS",
         "DEEPGEMM_L2_HINT")


def measure(case, env):
    for var in KNOBS:
        os.environ.pop(var, None)
    os.environ.update(env)
    return time_layout(case["layout"], case["m"], case["n"], case["k"], case.get("groups", 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("compare_picks: needs a CUDA device")
        return 0
    cases = json.load(open(args.cases))
    for case in cases:
        best = {name: 0.0 for name in case["configs"]}
        for _ in range(args.rounds):
            for name, env in case["configs"].items():
                best[name] = max(best[name], measure(case, env))
        case["tflops"] = best
        first = next(iter(best.values()))
        print(f"{case['layout']:6s} {case.get('groups', 1):2d} x {case['m']:4d} x {case['n']:5d} x {case['k']:5d}: "
              + "  ".join(f"{name} {v:6.1f} ({v / first:.2f})" for name, v in best.items()), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(cases, f, indent=1)
    for var in KNOBS:
        os.environ.pop(var, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
