"""deepgemm vs cuBLAS (torch._scaled_mm) on DeepSeek-V3 shapes: TFLOPS, GB/s and ratios.

Peers, in the same run: `torch._scaled_mm` with blockwise scales (1x128 for A, 128x128 for B: the
same recipe as deepgemm) where this torch/cuBLAS supports it, `torch._scaled_mm` with per-tensor
scales (a speed-of-light reference: less work, less accuracy) and, for dense shapes, the
PyTorch reference (fp32 matmul of dequantised inputs). Each op is timed as the replay of a CUDA
graph that cycles through enough copies of the inputs to exceed the 60 MB L2 (so weights come
from HBM, as in a real model), median of several replays.

    python deepgemm/benchmarks/bench_gemm.py [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

import deepgemm as dg
from deepgemm import ref

DENSE_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
DENSE_M = [1, 64, 128, 4096]
GROUPED_NK = [(4096, 7168), (7168, 2048)]
CONTIG = [(4, 8192), (8, 4096)]            # (groups, rows per group)
MASKED = [(1, 256), (8, 64), (32, 32), (32, 256)]  # (groups, rows per group)


def capture(fns) -> torch.cuda.CUDAGraph:
    """One CUDA graph of the closures fns (each run once first: JIT compiles, workspaces), replayed once."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    return g


def time_graph(fns, reps: int = 5) -> float:
    """Seconds per call: fns is a list of closures (one per input copy); one graph runs them all."""
    g = capture(fns)
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3 / len(fns))
    return statistics.median(times)


def n_copies(bytes_per_call: int) -> int:
    return max(1, min(8, math.ceil(150e6 / bytes_per_call)))


def scaled_mm_tensor(a, b):
    """cuBLAS FP8 with per-tensor scales (1.0) through torch._scaled_mm, as a closure: D = A B^T, BF16 out."""
    one = torch.ones((), device=a.device)
    return lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def dense_inputs(m, n, k):
    """Random FP8 operands (A's scales MN-major, as the kernels take them), and enough copies of them, each with
    a BF16 output, that one pass over the copies misses L2. Returns (a, b, copies of (a, b), outputs, bytes)."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    a = (a[0], dg.get_mn_major_tma_aligned_tensor(a[1]))
    nbytes = m * k + n * k + 2 * m * n + 4 * (m * k // 128 + n * k // 16384)
    copies = n_copies(nbytes)
    sets = [(a, b) if i == 0 else ((a[0].clone(), a[1].clone()), (b[0].clone(), b[1].clone())) for i in range(copies)]
    outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    return a, b, sets, outs, nbytes


_blockwise_layout = None


def scaled_mm_blockwise(a, sfa, b, sfb):
    """cuBLAS blockwise FP8 through torch._scaled_mm; finds the scale layout this torch accepts."""
    global _blockwise_layout
    variants = {
        "sfa_mn_major": lambda: (dg.get_mn_major_tma_aligned_tensor(sfa), sfb.t()),
        "sfa_mn_major_sfb_contig": lambda: (dg.get_mn_major_tma_aligned_tensor(sfa), sfb.t().contiguous()),
        "contig": lambda: (sfa.contiguous(), sfb.t().contiguous()),
    }
    order = [_blockwise_layout] if _blockwise_layout else list(variants)
    err = None
    for name in order:
        sa, sb = variants[name]()
        try:
            out = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
            _blockwise_layout = name
            return lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), out
        except Exception as e:  # noqa: BLE001 - unsupported by this torch/cuBLAS
            err = e
    raise RuntimeError(f"blockwise _scaled_mm unsupported: {str(err).splitlines()[0][:160]}")


def bench_dense(m, n, k, with_ref=True, peers=True):
    a, b, sets, outs, nbytes = dense_inputs(m, n, k)
    flops = 2 * m * n * k
    row = {"layout": "dense", "m": m, "n": n, "k": k}
    t = time_graph([(lambda s=s, o=o: dg.fp8_gemm_nt(s[0], s[1], o)) for s, o in zip(sets, outs)])
    r = torch.empty(m, n, device="cuda")
    ref.ref_gemm_nt(*a, *b, r)
    row.update(ours_us=t * 1e6, ours_tflops=flops / t / 1e12, ours_gbs=nbytes / t / 1e9,
               diff=dg.calc_diff(outs[0], r))
    if not peers:
        return row
    try:
        fns = []
        for s in sets:
            fn, out = scaled_mm_blockwise(s[0][0], s[0][1], s[1][0], s[1][1])
            fns.append(fn)
        row["cublas_block_diff"] = dg.calc_diff(out, r)
        tb = time_graph(fns)
        row.update(cublas_block_tflops=flops / tb / 1e12, speedup_vs_block=tb / t)
    except RuntimeError as e:
        row["cublas_block_error"] = str(e)
    tp = time_graph([scaled_mm_tensor(s[0][0], s[1][0]) for s in sets])
    row.update(cublas_tensor_tflops=flops / tp / 1e12, ratio_vs_tensor=tp / t)
    if with_ref:
        tr = time_graph([lambda: ref.ref_gemm_nt(*a, *b, r)], reps=3)
        row.update(torch_ref_tflops=flops / tr / 1e12, speedup_vs_ref=tr / t)
    return row


def bench_contiguous(g, mg, n, k, peers=True):
    """g groups of mg rows each, padded to 128 (rows counted: the g * mg valid ones)."""
    idx = dg.testing.make_contiguous_m_indices([mg] * g, device="cuda")
    m = idx.numel()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    a = (a[0], dg.get_mn_major_tma_aligned_tensor(a[1]))
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    flops, nbytes = 2 * g * mg * n * k, g * mg * k + g * n * k + 2 * g * mg * n
    t = time_graph([lambda: dg.m_grouped_fp8_gemm_nt_contiguous(a, b, d, idx)])
    r = torch.empty(m, n, device="cuda")
    ref.ref_m_grouped_gemm_nt_contiguous(*a, *b, r, idx)
    row = {"layout": "contiguous", "groups": g, "m_per_group": mg, "n": n, "k": k, "ours_us": t * 1e6,
           "ours_tflops": flops / t / 1e12, "ours_gbs": nbytes / t / 1e9,
           "diff": dg.calc_diff(d[idx >= 0], r[idx >= 0])}  # padding rows: never written
    if not peers:
        return row
    try:  # peer: one blockwise cuBLAS GEMM per group
        pg = -(-mg // 128) * 128  # a group's rows start every pg rows
        fns = [scaled_mm_blockwise(a[0][i * pg:i * pg + mg], a[1][i * pg:i * pg + mg].contiguous(),
                                   b[0][i], b[1][i])[0] for i in range(g)]
        tb = time_graph([lambda: [f() for f in fns]])
        row.update(cublas_block_tflops=flops / tb / 1e12, speedup_vs_block=tb / t)
    except RuntimeError as e:
        row["cublas_block_error"] = str(e)
    tp = time_graph([scaled_mm_tensor(a[0], b[0][0])])
    row.update(cublas_tensor_tflops=2 * m * n * k / tp / 1e12, ratio_vs_tensor=tp / t)
    return row


def bench_masked(g, mg, n, k, peers=True):
    x = torch.randn(g, mg, k, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    a = (a[0], dg.get_mn_major_tma_aligned_tensor(a[1]))
    mm = torch.full((g,), mg, dtype=torch.int32, device="cuda")
    flops, nbytes = 2 * g * mg * n * k, g * (mg * k + n * k + 2 * mg * n)
    copies = n_copies(nbytes)
    bs = [b] + [(b[0].clone(), b[1].clone()) for _ in range(copies - 1)]
    ds = [torch.empty(g, mg, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    t = time_graph([(lambda bb=bb, d=d: dg.m_grouped_fp8_gemm_nt_masked(a, bb, d, mm, mg)) for bb, d in zip(bs, ds)])
    r = torch.empty(g, mg, n, device="cuda")
    ref.ref_m_grouped_gemm_nt_masked(*a, *b, r, mm)
    row = {"layout": "masked", "groups": g, "m_per_group": mg, "n": n, "k": k, "ours_us": t * 1e6,
           "ours_tflops": flops / t / 1e12, "ours_gbs": nbytes / t / 1e9, "diff": dg.calc_diff(ds[0], r)}
    if not peers:
        return row
    try:
        fns = [[scaled_mm_blockwise(a[0][i], a[1][i].contiguous(), bb[0][i], bb[1][i])[0] for i in range(g)] for bb in bs]
        tb = time_graph([(lambda fs=fs: [f() for f in fs]) for fs in fns])
        row.update(cublas_block_tflops=flops / tb / 1e12, speedup_vs_block=tb / t)
    except RuntimeError as e:
        row["cublas_block_error"] = str(e)
    return row


def fmt(v, p=1):
    return "-" if v is None else (f"{v:.{p}f}" if isinstance(v, float) else str(v))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--compare-only", action="store_true", help="skip the main table (with --compare)")
    ap.add_argument("--compare", action="append", default=[], metavar="ENV=V1,V2",
                    help="also time our kernels under each value of an environment switch on small-M shapes, "
                         "e.g. DEEPGEMM_KSPLIT=0,1 or DEEPGEMM_SMALL_M_BN=fill,pow2 (repeatable); several switches "
                         "at once: DEEPGEMM_BN256&DEEPGEMM_TMA_STORE=0&0,1&1 (values joined by &)")
    ap.add_argument("--shapes", default=None, metavar="MxNxK,...",
                    help="with --compare: time these dense shapes under every switch instead of its own list")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_gemm: needs a CUDA device")
        return 0
    torch.manual_seed(0)
    t0 = time.time()
    rows = []
    dense = [(m, n, k) for m in DENSE_M for n, k in DENSE_NK]
    if args.quick:
        dense = [(64, 7168, 2048), (128, 7168, 2048), (4096, 7168, 2048), (4096, 4096, 7168)]
    if args.compare_only:
        dense = []
    for m, n, k in dense:
        rows.append(bench_dense(m, n, k, with_ref=not args.quick))
        print(json.dumps(rows[-1]), flush=True)
    for n, k in ([] if args.compare_only else GROUPED_NK):
        for g, mg in (CONTIG[:1] if args.quick else CONTIG):
            rows.append(bench_contiguous(g, mg, n, k))
            print(json.dumps(rows[-1]), flush=True)
        for g, mg in (MASKED[1:3] if args.quick else MASKED):
            rows.append(bench_masked(g, mg, n, k))
            print(json.dumps(rows[-1]), flush=True)
    variants = []
    import os
    cases = [("dense", 1, 7168, 16384), ("dense", 1, 4096, 7168), ("dense", 16, 7168, 2048),
             ("dense", 64, 7168, 2048), ("dense", 64, 2112, 7168), ("dense", 64, 24576, 1536),
             ("dense", 128, 7168, 2048), ("dense", 128, 4096, 7168), ("dense", 64, 4096, 7168),
             ("masked", 8, 4096, 7168), ("masked", 32, 7168, 2048), ("dense", 4096, 7168, 2048), ("dense", 4096, 4096, 7168)]
    large = [("dense", 4096, n, k) for n, k in DENSE_NK]  # multicast of B (BM = 128); small M: of A
    # contiguous cases: m is (groups, rows per group)
    contig = [("contiguous", gm, n, k) for n, k in GROUPED_NK for gm in CONTIG]
    per_env = {"DEEPGEMM_MULTICAST": large + cases,
               "DEEPGEMM_BN256": large + contig,  # 128 x 256 tiles apply only at M > 128
               # dense, and the grouped layouts at K = 2048 ((groups, rows per group); contiguous groups padded
               # to 128 rows too, whose boxes with padding are stored directly; masked: all rows valid)
               "DEEPGEMM_TMA_STORE": large + [c for c in contig if c[3] == 2048]
               + [("contiguous", gm, 7168, 2048) for gm in ((8, 1000), (32, 96), (64, 40), (128, 64))]
               + [("masked", gm, 7168, 2048) for gm in MASKED],
               "DEEPGEMM_MIN_SMS": large + contig,
               # split-K applies to FP8 dense at M <= 128 only: the 18 small-M DeepSeek-V3 rows
               "DEEPGEMM_SPLIT_K": [("dense", m, n, k) for m in (1, 64, 128) for n, k in DENSE_NK],
               # the small-M kernel: FP8 dense at M <= 16
               "DEEPGEMM_GEMV": [("dense", m, n, k) for m in (1, 4, 8, 16) for n, k in DENSE_NK],
               "DEEPGEMM_GEMV_KS": [("dense", m, n, k) for m in (1, 16) for n, k in DENSE_NK],
               # PDL changes every launch: all dense rows, two masked and two contiguous cases
               "DEEPGEMM_PDL": [("dense", m, n, k) for m in DENSE_M for n, k in DENSE_NK]
               + [("masked", 8, 4096, 7168), ("masked", 32, 7168, 2048)] + contig[:1] + contig[-1:]}
    with_peer = {"DEEPGEMM_SPLIT_K", "DEEPGEMM_PDL"}  # also time cuBLAS blockwise per case: speed-ups per value in one run
    for spec in args.compare:
        env, values = spec.split("=")
        envs = env.split("&")
        todo = next((per_env[e] for e in envs if e in per_env), cases)
        if args.shapes:
            todo = [("dense", *map(int, spec.split("x"))) for spec in args.shapes.split(",")]
        for layout, m, n, k in todo:
            res = {}
            for i, val in enumerate(values.split(",")):
                vals = val.split("&")
                if len(vals) != len(envs):
                    raise SystemExit(f"--compare {spec}: value {val!r} does not give one value per switch")
                os.environ.update(zip(envs, vals))
                peer = i == 0 and layout == "dense" and m > 1 and any(e in with_peer for e in envs)
                row = (bench_dense(m, n, k, with_ref=False, peers=peer) if layout == "dense"
                       else bench_contiguous(*m, n, k, peers=False) if layout == "contiguous"
                       else bench_masked(*(m if isinstance(m, tuple) else (m, 64)), n, k, peers=False))
                res[val] = row["ours_tflops"]
                if row.get("cublas_block_tflops"):
                    res["cublas_block"] = row["cublas_block_tflops"]
                if row["diff"] > 1e-5:  # a variant that computes wrong numbers is not a speed-up
                    res[val + "_diff"] = row["diff"]
            for e in envs:
                os.environ.pop(e)
            variants.append({"env": env, "layout": layout, "m": m, "n": n, "k": k, **res})
            print(json.dumps(variants[-1]), flush=True)
    from deepgemm.jit import compiler
    compiles = [(r.params.get("kind"), r.params.get("n"), r.params.get("k"), r.params.get("bm"), r.params.get("bn"),
                 r.backend, round(r.seconds, 2)) for r in compiler.COMPILE_LOG if r.backend != "cache"]
    print(f"\ndevice: {torch.cuda.get_device_name()}, torch {torch.__version__}, blockwise layout: {_blockwise_layout}")
    print("| layout | M (G x m) | N | K | ours us | ours TFLOPS | GB/s | cuBLAS block TFLOPS | x vs block "
          "| cuBLAS tensor TFLOPS | ours/tensor | diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mdesc = r.get("m") if r["layout"] == "dense" else f"{r['groups']}x{r['m_per_group']}"
        print(f"| {r['layout']} | {mdesc} | {r['n']} | {r['k']} | {fmt(r['ours_us'])} | {fmt(r['ours_tflops'])} "
              f"| {fmt(r['ours_gbs'], 0)} | {fmt(r.get('cublas_block_tflops'))} | {fmt(r.get('speedup_vs_block'), 2)} "
              f"| {fmt(r.get('cublas_tensor_tflops'))} | {fmt(r.get('ratio_vs_tensor'), 2)} | {r['diff']:.1e} |")
    sp = [r["speedup_vs_block"] for r in rows if r["layout"] == "dense" and "speedup_vs_block" in r]
    sp_small = [r["speedup_vs_block"] for r in rows if r["layout"] == "dense" and r["m"] <= 128 and "speedup_vs_block" in r]
    gm = lambda v: math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")  # noqa: E731
    summary = {"geomean_speedup_dense": gm(sp), "geomean_speedup_dense_m_le_128": gm(sp_small),
               "max_dense_tflops": max((r["ours_tflops"] for r in rows if r["layout"] == "dense"), default=float("nan")),
               "compiles": compiles, "seconds": time.time() - t0, "blockwise_layout": _blockwise_layout}
    print(f"geomean speed-up vs cuBLAS blockwise: dense {summary['geomean_speedup_dense']:.2f}x, "
          f"M<=128 {summary['geomean_speedup_dense_m_le_128']:.2f}x; max dense {summary['max_dense_tflops']:.0f} TFLOPS")
    print("cold compiles (kind, N, K, BM, BN, backend, s):", compiles)
    for v in variants:
        vals = ", ".join(f"{key}={v[key]:.3g}" for key in v if key not in ("env", "layout", "m", "n", "k"))
        print(f"{v['env']} {v['layout']} M={v['m']} N={v['n']} K={v['k']}: {vals} TFLOPS")
    for env in sorted({v["env"] for v in variants if "cublas_block" in v}):  # geo-mean vs cuBLAS per value
        rows_e = [v for v in variants if v["env"] == env and "cublas_block" in v]
        keys = [key for key in rows_e[0] if key not in ("env", "layout", "m", "n", "k", "cublas_block")
                and not key.endswith("_diff")]
        best = [max(v[key] for key in keys) / v["cublas_block"] for v in rows_e]
        per = ", ".join(f"{key}={gm([v[key] / v['cublas_block'] for v in rows_e]):.2f}x" for key in keys)
        ms = ", ".join(str(m) for m in sorted({v["m"] for v in rows_e}))
        print(f"{env}: geomean vs cuBLAS blockwise over {len(rows_e)} dense cases (M = {ms}): {per}; "
              f"best value per shape {gm(best):.2f}x")
        summary.setdefault("compare_geomean_vs_cublas", {})[env] = {
            key: gm([v[key] / v["cublas_block"] for v in rows_e]) for key in keys}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary, "epilogue_variants": variants, "device": torch.cuda.get_device_name(),
                       "torch": torch.__version__}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
