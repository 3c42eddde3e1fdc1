"""`python -m deepgemm`: one GEMM of each layout on built-in random data, checked against the
unquantised product (DeepGEMM's diff < 1e-3), with TFLOPS. CPU runs the reference path."""
from __future__ import annotations

import argparse
import sys
import time

import torch

import deepgemm as dg


def _timed(fn, cuda: bool, reps: int) -> float:
    fn()  # warm-up (JIT compile on CUDA)
    if cuda:
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        e.synchronize()
        return s.elapsed_time(e) / 1e3 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deepgemm", description=__doc__)
    ap.add_argument("--version", action="store_true", help="print the version and exit")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    args = ap.parse_args(argv)
    if args.version:
        print(f"deepgemm {dg.__version__}")
        return 0
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = dev.startswith("cuda")
    m, n, k, g = (4096, 7168, 2048, 4) if cuda else (512, 512, 1024, 4)
    reps = 20 if cuda else 2
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dev, torch.bfloat16)

    results = []

    def run(name, fn, d, expect, flops):
        d.fill_(float("nan"))
        secs = _timed(fn, cuda, reps)
        diff = dg.calc_diff(d.float().nan_to_num(1e4), expect)
        ok = diff < 1e-3
        results.append((name, ok, flops / secs / 1e12))
        print(f"{name:<34} diff={diff:.2e} {'ok' if ok else 'FAIL'}  {flops / secs / 1e12:8.3f} TFLOPS")

    # dense FP8
    x, y = rnd(m, k), rnd(n, k)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    d = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    run(f"fp8_gemm_nt {m}x{n}x{k}", lambda: dg.fp8_gemm_nt(a, b, d), d, x.float() @ y.float().t(), 2 * m * n * k)
    # dense BF16
    run(f"bf16_gemm_nt {m}x{n}x{k}", lambda: dg.bf16_gemm_nt(x, y, d), d, x.float() @ y.float().t(), 2 * m * n * k)
    # M-grouped contiguous: g experts with m/g rows each
    mg = m // g
    yg = rnd(g, n, k)
    bg = dg.per_block_cast_to_fp8(yg)
    idx = dg.testing.make_contiguous_m_indices([mg] * g, device=dev)
    expect = torch.cat([x[i * mg:(i + 1) * mg].float() @ yg[i].float().t() for i in range(g)])
    run(f"m_grouped_contiguous {g}x{mg}x{n}x{k}", lambda: dg.m_grouped_fp8_gemm_nt_contiguous(a, bg, d, idx), d,
        expect, 2 * m * n * k)
    # M-grouped masked (decode): g groups, 64 rows max, some rows masked out
    m_max = 64
    xm = rnd(g, m_max, k)
    am = dg.per_token_cast_to_fp8(xm)
    masked = torch.tensor([64, 1, 0, 33][:g] + [m_max] * max(0, g - 4), dtype=torch.int32, device=dev)
    dm = torch.empty(g, m_max, n, device=dev, dtype=torch.bfloat16)
    valid = torch.arange(m_max, device=dev)[None, :] < masked[:, None]
    expect_m = torch.einsum("gmk,gnk->gmn", xm.float(), yg.float()) * valid[..., None]

    def masked_fn():
        dg.m_grouped_fp8_gemm_nt_masked(am, bg, dm, masked, 32)

    dm.fill_(float("nan"))
    secs = _timed(masked_fn, cuda, reps)
    untouched = bool(dm[~valid].float().isnan().all())
    diff = dg.calc_diff(torch.where(valid[..., None], dm.float(), 0.0), expect_m)
    ok = diff < 1e-3 and untouched
    flops = 2 * int(masked.sum()) * n * k
    results.append(("masked", ok, flops / secs / 1e12))
    print(f"{'m_grouped_masked ' + str(g) + 'x' + str(m_max):<34} diff={diff:.2e} {'ok' if ok else 'FAIL'}  "
          f"{flops / secs / 1e12:8.3f} TFLOPS (padding rows untouched: {untouched})")

    if cuda:
        from deepgemm.jit import compiler
        for r in compiler.COMPILE_LOG:
            if r.backend != "cache":
                print(f"compiled {r.params.get('kind')}/{'fp8' if r.params.get('fp8') else 'bf16'} "
                      f"N={r.params.get('n')} K={r.params.get('k')} BM={r.params.get('bm')} BN={r.params.get('bn')} "
                      f"with {r.backend} in {r.seconds:.2f} s")
    n_ok = sum(ok for _, ok, _ in results)
    print(f"summary: backend={'CUDA' if cuda else 'CPU'} result={n_ok}/{len(results)} layouts ok, "
          f"fp8 dense {results[0][2]:.3f} TFLOPS")
    return 0 if n_ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
