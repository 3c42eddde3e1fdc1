"""The SM clock and power behind a dense FP8 GEMM's TFLOPS: one call on a rested card against calls back to back.

    python deepgemm/benchmarks/clock_probe.py [--shapes 4096x7168x16384,128x7168x16384] [--seconds 4]
        [--variants "default;DEEPGEMM_BN256=2;DEEPGEMM_MIN_SMS=1"]

Per shape (M x N x K; inputs as bench_gemm.py makes them, checked against the reference: diff < 1e-3): one call
after 2 s idle (a CUDA graph of one call, timed with events), then a graph of 20 calls replayed back to back for
--seconds while nvidia-smi samples the SM clock and power every 50 ms, and the clock event reasons nvidia-smi
reports as active in the middle of that loop. bench_gemm.py times five replays with a host sync after each
(closer to the rested figure); a model's layers run back to back (the sustained one). --variants runs every shape
under each setting of the JIT's switches in turn (';'-separated; '+' joins several; "default" = none set), to
compare kernels at equal power: under the cap, the one that spends less energy per FLOP runs at a higher clock."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

import torch

import deepgemm as dg
from deepgemm import ref

QUERY = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"


def graph_of(fn, n: int) -> torch.cuda.CUDAGraph:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    return g


def run_shape(spec: str, seconds: float, label: str = "") -> None:
    m, n, k = (int(v) for v in spec.split("x"))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    a = (a[0], dg.get_mn_major_tma_aligned_tensor(a[1]))
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    call = lambda: dg.fp8_gemm_nt(a, b, out)
    call()
    r = torch.empty(m, n, device="cuda")
    ref.ref_gemm_nt(*a, *b, r)
    diff = dg.calc_diff(out, r)
    if not diff < 1e-3:
        raise SystemExit(f"{spec}: output disagrees with the reference (diff {diff})")
    single, loop20 = graph_of(call, 1), graph_of(call, 20)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    time.sleep(2.0)
    start.record()
    single.replay()
    stop.record()
    torch.cuda.synchronize()
    rested = start.elapsed_time(stop) * 1e3
    for _ in range(max(1, int(0.5e6 / (20 * rested)))):      # ~0.5 s of warm-up
        loop20.replay()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)
    perf = subprocess.Popen("sleep 1; nvidia-smi -q -d PERFORMANCE", shell=True, stdout=subprocess.PIPE, text=True)
    reps = max(1, int(seconds * 1e6 / (20 * rested)))
    start.record()
    for _ in range(reps):
        loop20.replay()
    stop.record()
    torch.cuda.synchronize()
    smi.terminate()
    sustained = start.elapsed_time(stop) * 1e3 / (20 * reps)
    rows = [[float(v) for v in ln.split(",")] for ln in smi.communicate()[0].splitlines() if ln.count(",") == 4]
    med = [statistics.median(col) for col in zip(*rows)] if rows else [float("nan")] * 5
    reasons = [" ".join(ln.split()) for ln in perf.communicate()[0].splitlines() if ln.strip().endswith(": Active")]
    flops = 2 * m * n * k
    print(f"{spec}{label}: one call after 2 s idle {rested:.1f} us ({flops / rested / 1e6:.0f} TFLOPS); back to back "
          f"{sustained:.1f} us ({flops / sustained / 1e6:.0f} TFLOPS); SM clock {med[0]:.0f} of {med[1]:.0f} MHz, "
          f"{med[2]:.0f} of {med[3]:.0f} W, {med[4]:.0f} C ({len(rows)} samples); active: {', '.join(reasons) or 'none'}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x7168x16384,4096x4096x7168,128x7168x16384")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--variants", default="default", help="';'-separated settings, e.g. 'default;DEEPGEMM_BN256=2'")
    args = ap.parse_args()
    variants = []
    for v in args.variants.split(";"):
        sets = [] if v.strip() in ("", "default") else [kv.split("=", 1) for kv in v.split("+")]
        if any(len(kv) != 2 or not kv[0].startswith("DEEPGEMM_") for kv in sets):
            ap.error(f"--variants: expected 'default' or DEEPGEMM_X=V[+DEEPGEMM_Y=W], got {v!r}")
        variants.append(dict(sets))
    switches = {k for env in variants for k in env}
    print(f"device: {torch.cuda.get_device_name()}  deepgemm {dg.__version__}")
    for spec in args.shapes.split(","):
        for env in variants:
            for k in switches:
                os.environ.pop(k, None)
            os.environ.update(env)
            run_shape(spec, args.seconds, "".join(f" {k}={v}" for k, v in env.items()) or (" default" if len(variants) > 1 else ""))


if __name__ == "__main__":
    main()
