"""Where a small GEMM's time goes inside a CUDA graph: kernel durations and the gaps between kernels.

    python deepgemm/benchmarks/kernel_timeline.py [--shapes 64x4096x7168,128x7168x16384] [--json PATH]

Per dense shape (M x N x K), ours and cuBLAS (`torch._scaled_mm`, blockwise and per-tensor scales) each run as
bench_gemm.py times them: one graph over enough input copies to miss L2. Three replays run under torch.profiler
(CUPTI records every kernel node of a replayed graph); from the trace: the call's period (first kernel start to
last kernel end over the calls), each kernel's median duration, and the median start-to-start spacing. With
programmatic dependent launch a kernel starts before its predecessor ends, so its duration includes that wait.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gemm import capture, dense_inputs, scaled_mm_blockwise, scaled_mm_tensor, time_graph  # noqa: E402

import deepgemm as dg  # noqa: E402

SHAPES = [(m, n, k) for m in (64, 128) for n, k in
          [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]]


def graph_kernels(fns, reps: int = 3) -> list[dict]:
    """Kernel records (name, ts, dur in us) of `reps` replays of one graph over fns."""
    g = capture(fns)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            g.replay()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    os.unlink(path)
    ks = [e for e in events if e.get("cat") == "kernel"]
    return sorted(({"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"])} for e in ks),
                  key=lambda e: e["ts"])


def summarise(ks: list[dict], calls: int) -> dict:
    if not ks:
        return {"kernels": 0}
    period = (max(e["ts"] + e["dur"] for e in ks) - ks[0]["ts"]) / calls
    names = {}
    for e in ks:
        names.setdefault(e["name"][:60], []).append(e["dur"])
    starts = [b["ts"] - a["ts"] for a, b in zip(ks, ks[1:])]
    return {"period_us": period, "kernels_per_call": len(ks) / calls,
            "spacing_us": statistics.median(starts) if starts else 0.0,
            "durations": {n: statistics.median(d) for n, d in names.items()}}


def run_shape(m: int, n: int, k: int) -> dict:
    _, _, sets, outs, _ = dense_inputs(m, n, k)
    copies = len(sets)
    peers = {
        "ours": [(lambda s=s, o=o: dg.fp8_gemm_nt(s[0], s[1], o)) for s, o in zip(sets, outs)],
        "cublas_tensor": [scaled_mm_tensor(s[0][0], s[1][0]) for s in sets],
    }
    try:
        peers["cublas_block"] = [scaled_mm_blockwise(s[0][0], s[0][1], s[1][0], s[1][1])[0] for s in sets]
    except RuntimeError:
        pass
    row = {"m": m, "n": n, "k": k, "copies": copies}
    for name, fns in peers.items():
        reps = 3
        s = summarise(graph_kernels(fns, reps), reps * copies)
        s["event_us"] = time_graph(fns) * 1e6
        row[name] = s
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="", help="MxNxK,... (default: the 12 dense rows of M = 64 and 128)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    rows = []
    for m, n, k in shapes:
        row = run_shape(m, n, k)
        rows.append(row)
        bytes_b = n * k
        for name in ("ours", "cublas_tensor", "cublas_block"):
            if name not in row:
                continue
            s = row[name]
            durs = " ".join(f"{d:.1f}" for d in s["durations"].values())
            print(f"{m}x{n}x{k} {name:14s} event {s['event_us']:6.1f} us  period {s['period_us']:6.1f}  "
                  f"spacing {s['spacing_us']:6.1f}  kernels/call {s['kernels_per_call']:.1f}  dur [{durs}]  "
                  f"B at {bytes_b / s['period_us'] / 1e6:.2f} TB/s  {list(s['durations'])}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
