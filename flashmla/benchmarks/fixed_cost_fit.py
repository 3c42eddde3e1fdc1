"""Fixed-cost model of a bench_decode.py run (CPU only; BENCHMARKS.md, "fixed costs at short sequences").

For every memory-bound row (s_q * h_q <= 64) of a bench JSON it recomputes the scheduler's parts for the
shape (the bench's own seqlens: uniform, or ragged from its seeded generator) and fits, per row count,
    time = a + b * (pages of the largest part)
then prints, per shape, the largest part and the split partials under the scheduler the run used
(c pages per segment: the JSON's "split_ovh", written by bench_decode.py since the per-segment scheduler
became the default, or --measured-c) and under other values of FLASHMLA_SPLIT_OVH=c, and the time the
fit predicts for their largest part. (JSONs of runs before that measured a cost-line scheduler that is
gone: their fit is not reproducible here.)

    python flashmla/benchmarks/fixed_cost_fit.py --json OUT/bench.json [--c 3,8] [--measured-c 5]
"""
from __future__ import annotations

import argparse
import json
import random

import numpy as np
import torch

from flashmla import ref

NUM_SMS = 132


def bench_lens(batch: int, L: int, h_q: int, s_q: int, kind: str) -> list[int]:
    """The seqlens bench_decode.py used for a shape (its ragged lengths come from a seeded RNG)."""
    rng = random.Random(batch * L + h_q * 7 + s_q)
    return [L] * batch if kind == "uniform" else [rng.randint(1, 2 * L) for _ in range(batch)]


def schedule_stats(lens: list[int], parts: int, c: int) -> tuple[int, float, int]:
    """(pages of the largest part, mean pages per part, split partials) of a schedule."""
    meta, splits = ref.schedule_ref(torch.tensor(lens, dtype=torch.int32), parts, c)
    pages = []
    for p in range(parts):
        b0, k0, b1, k1, _ = meta[p, :5].tolist()
        n = 0
        if (b0, k0) != (b1, k1):
            for b in range(b0, (b1 if k1 > 0 else b1 - 1) + 1):
                nb = (lens[b] + 63) // 64
                n += (k1 if b == b1 else nb) - (k0 if b == b0 else 0)
        pages.append(n)
    partials = sum(int(splits[b + 1] - splits[b]) for b in range(len(lens)) if splits[b + 1] - splits[b] > 1)
    return max(pages), sum(pages) / parts, partials


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True, help="a bench_decode.py --json output")
    ap.add_argument("--c", default="3,8", help="FLASHMLA_SPLIT_OVH values to predict")
    ap.add_argument("--measured-c", type=int, default=None,
                    help="pages per segment of the measured run (default: the JSON's split_ovh)")
    args = ap.parse_args()
    cs = [int(x) for x in args.c.split(",") if x]
    data = json.load(open(args.json))
    c0 = args.measured_c if args.measured_c is not None else data.get("split_ovh")
    if c0 is None:
        ap.error("the JSON has no split_ovh (a run before the per-segment scheduler): pass --measured-c")
    rows = [r for r in data["rows"] if r.get("kind") in ("uniform", "ragged") and r["h_q"] * r["s_q"] <= 64]
    by_rows: dict[int, list] = {}
    for r in rows:
        m = r["h_q"] * r["s_q"]
        parts = ref.num_sm_parts_for(NUM_SMS, m, 1)
        lens = bench_lens(r["batch"], r["seqlen"], r["h_q"], r["s_q"], r["kind"])
        stats = [schedule_stats(lens, parts, c0)] + [schedule_stats(lens, parts, c) for c in cs]
        by_rows.setdefault(m, []).append((r, stats))
    for m, items in sorted(by_rows.items()):
        x = np.array([[1.0, s[0][0]] for _, s in items])
        y = np.array([r["ours_s"] * 1e6 for r, _ in items])
        (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
        rms = float(np.sqrt(((y - x @ np.array([a, b])) ** 2).mean()))
        print(f"\n{m} query rows: t = {a:.1f} us + {b:.3f} us x (max pages of a part), rms residual {rms:.1f} us")
        print(f"{'batch':>5} {'keys':>6} {'h_q':>4} {'s_q':>3} {'kind':>7} {'us':>7} {'TB/s':>5} | max pages "
              f"(mean) / partials: measured c={c0}" + "".join(f" | c={c}: max, partials, model us" for c in cs))
        for r, stats in items:
            t = r["ours_s"] * 1e6
            tbs = r["gbps"] / 1e3
            line = (f"{r['batch']:>5} {r['seqlen']:>6} {r['h_q']:>4} {r['s_q']:>3} {r['kind']:>7} {t:7.1f} {tbs:5.2f} | "
                    f"{stats[0][0]:3d} ({stats[0][1]:5.1f}) / {stats[0][2]:3d}")
            for c, s in zip(cs, stats[1:]):
                line += f" | {s[0]:3d}, {s[2]:3d}, {t + b * (s[0] - stats[0][0]):7.1f}"
            print(line)


if __name__ == "__main__":
    main()
