"""Repro / regression check for the intermittent 'unspecified launch failure' that ci/gpu hit at 215a6a8
(bench_gemm --quick, masked 8 groups x 64 rows, N=4096, K=7168, DEEPGEMM_KSPLIT=1).

Each variant runs in its own process (CUDA errors are sticky, a broken pipeline can hang): eager calls,
one CUDA-graph capture, then `--replays` replays; every replay's output must equal the eager output
bit for bit (the kernel is deterministic), and the eager output must match the reference.

Variants: the K split on and off with both BF16 epilogues, and two negative controls that force the
K split back to the odd pipeline depth (7 stages) that the failing runs used. The fix (an even
depth, see deepgemm/jit/kernels.py: stages_ok_for_ksplit) predicts: controls may fail or mismatch,
everything else is clean.
    python deepgemm/scripts/repro_masked.py [--replays 200] [--no-controls]
Exit status 1 if a non-control variant failed.
"""
import argparse
import dataclasses
import os
import subprocess
import sys

VARIANTS = [dict(DEEPGEMM_KSPLIT=k, DEEPGEMM_EPILOGUE=e) for k in ("1", "0") for e in ("staged", "direct")]
CONTROLS = [dict(DEEPGEMM_KSPLIT="1", DEEPGEMM_EPILOGUE=e, REPRO_FORCE_STAGES="7") for e in ("staged", "direct")]


def one(replays: int, g=8, mg=64, n=4096, k=7168, eager=20):
    import torch
    import deepgemm as dg
    from deepgemm import ref
    from deepgemm.jit import kernels

    force = os.environ.get("REPRO_FORCE_STAGES")
    make = kernels.make_config
    cfgs = []

    def patched(*args, **kw):
        cfg = make(*args, **kw)
        if force:
            cfg = dataclasses.replace(cfg, stages=int(force))
        cfgs.append(cfg)
        return cfg
    kernels.make_config = patched

    stage = "setup"
    try:
        torch.manual_seed(0)
        x = torch.randn(g, mg, k, device="cuda", dtype=torch.bfloat16)
        y = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16)
        a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
        a = (a[0], dg.get_mn_major_tma_aligned_tensor(a[1]))
        mm = torch.full((g,), mg, dtype=torch.int32, device="cuda")
        d = torch.empty(g, mg, n, device="cuda", dtype=torch.bfloat16)
        stage = "eager"
        for _ in range(eager):
            dg.m_grouped_fp8_gemm_nt_masked(a, b, d, mm, mg)
        torch.cuda.synchronize()
        c = cfgs[-1]
        print(f"config: bm={c.bm} bn={c.bn} stages={c.stages} epi={c.epi} ksplit={c.ksplit}", flush=True)
        first = d.clone()
        r = torch.empty(g, mg, n, device="cuda")
        ref.ref_m_grouped_gemm_nt_masked(*a, *b, r, mm)
        diff = dg.calc_diff(first, r)
        stage = "capture"
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            dg.m_grouped_fp8_gemm_nt_masked(a, b, d, mm, mg)
        stage = "replay"
        bad = 0
        for i in range(replays):
            d.fill_(float("nan"))
            gr.replay()
            torch.cuda.synchronize()
            bad += not torch.equal(d, first)
        verdict = "ok" if bad == 0 and diff < 1e-5 else "MISMATCH"
        print(f"{verdict}: diff vs ref {diff:.1e}, {bad}/{replays} replays differ from the eager output", flush=True)
        sys.exit(0 if verdict == "ok" else 2)
    except Exception as e:  # noqa: BLE001 - a CUDA error: report it
        print(f"FAIL at {stage}: {str(e).splitlines()[0]}", flush=True)
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--no-controls", action="store_true")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per variant (a hang counts as a failure)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args.replays)
    failed = False
    for v in VARIANTS + ([] if args.no_controls else CONTROLS):
        control = "REPRO_FORCE_STAGES" in v
        try:
            r = subprocess.run([sys.executable, __file__, "--one", "--replays", str(args.replays)],
                               env={**os.environ, **v}, capture_output=True, text=True, timeout=args.timeout)
            out = " | ".join(r.stdout.strip().splitlines()) or r.stderr.strip().splitlines()[-1:]
            ok = r.returncode == 0
        except subprocess.TimeoutExpired:
            out, ok = f"HANG: no result in {args.timeout} s", False
        print(("control " if control else "") + str(v), out, flush=True)
        failed |= not ok and not control
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
