"""Repro for the intermittent 'unspecified launch failure' seen by ci/gpu (bench_gemm --quick,
masked 8x64, N=4096, K=7168) at 215a6a8. Runs one variant per subprocess (CUDA errors are sticky):
    python deepgemm/scripts/repro_masked.py            # all variants
"""
import os
import subprocess
import sys

VARIANTS = [dict(DEEPGEMM_KSPLIT=k, DEEPGEMM_EPILOGUE=e) for k in ("1", "0") for e in ("staged", "direct")]


def one(g=8, mg=64, n=4096, k=7168, eager=20, replays=50):
    import torch
    import deepgemm as dg
    torch.manual_seed(0)
    x = torch.randn(g, mg, k, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    a = (a[0], dg.get_mn_major_tma_aligned_tensor(a[1]))
    mm = torch.full((g,), mg, dtype=torch.int32, device="cuda")
    d = torch.empty(g, mg, n, device="cuda", dtype=torch.bfloat16)
    stage = "eager"
    try:
        for _ in range(eager):
            dg.m_grouped_fp8_gemm_nt_masked(a, b, d, mm, mg)
        torch.cuda.synchronize()
        stage = "capture"
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            dg.m_grouped_fp8_gemm_nt_masked(a, b, d, mm, mg)
        stage = "replay"
        for i in range(replays):
            gr.replay()
            torch.cuda.synchronize()
        print("ok", flush=True)
    except Exception as e:  # noqa: BLE001 - report and exit non-zero
        print(f"FAIL at {stage}: {str(e).splitlines()[0]}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "one":
        one()
        sys.exit(0)
    for v in VARIANTS:
        r = subprocess.run([sys.executable, __file__, "one"], env={**os.environ, **v},
                           capture_output=True, text=True, timeout=120)
        print(v, (r.stdout.strip() or r.stderr.strip().splitlines()[-1:]), flush=True)
