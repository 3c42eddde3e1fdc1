"""Host time of eager deepgemm calls, on GEMMs small enough that the CPU, not the GPU, sets the pace.

    python deepgemm/benchmarks/host_overhead.py [--calls 2000]

Each line is the mean wall time per call of N calls in a row, then one sync: the public dense call and its body
through the custom op's dispatch (what torch.compile sees) beside the body called directly (what eager calls run
since session 20); the contiguous and masked grouped calls with the same m_indices / masked_m tensor each time
(values read once) and with a fresh copy per call (read, and so synced, every time)."""
from __future__ import annotations

import argparse
import time

import torch

import deepgemm as dg
from deepgemm import gemm


def per_call(fn, calls: int) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    n = args.calls
    x, y = torch.randn(1, 7168, device="cuda"), torch.randn(2112, 7168, device="cuda")
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)
    a = (a[0], dg.get_mn_major_tma_aligned_tensor(a[1]))
    d = torch.empty(1, 2112, device="cuda", dtype=torch.bfloat16)
    body = (a[0], a[1], b[0], b[1].contiguous(), d, None)

    g, rows, nn, k = 4, 128, 512, 512
    ac = dg.per_token_cast_to_fp8(torch.randn(g * rows, k, device="cuda"))
    bc = dg.per_block_cast_to_fp8(torch.randn(g, nn, k, device="cuda"))
    dc = torch.empty(g * rows, nn, device="cuda", dtype=torch.bfloat16)
    idx = dg.testing.make_contiguous_m_indices([rows] * g).cuda()
    idx_copies = [idx.clone() for _ in range(n + 1)]
    am = dg.per_token_cast_to_fp8(torch.randn(g, 32, k, device="cuda"))
    dm = torch.empty(g, 32, nn, device="cuda", dtype=torch.bfloat16)
    mm = torch.full((g,), 16, dtype=torch.int32, device="cuda")
    mm_copies = [mm.clone() for _ in range(n + 1)]
    it = iter(range(10 ** 9))

    pieces = [
        ("fp8_gemm_nt 1 x 2112 x 7168 (public, eager)", lambda: dg.fp8_gemm_nt(a, b, d)),
        ("  its body through the custom op's dispatch", lambda: gemm._gemm_nt_op(*body)),
        ("  its body called directly", lambda: gemm._gemm_nt_impl(*body)),
        ("contiguous 4 x 128 x 512 x 512, same m_indices", lambda: dg.m_grouped_fp8_gemm_nt_contiguous(ac, bc, dc, idx)),
        ("contiguous, a fresh m_indices per call", lambda: dg.m_grouped_fp8_gemm_nt_contiguous(
            ac, bc, dc, idx_copies[next(it) % len(idx_copies)])),
        ("masked 4 x 32 x 512 x 512, same masked_m", lambda: dg.m_grouped_fp8_gemm_nt_masked(am, bc, dm, mm, 16)),
        ("masked, a fresh masked_m per call", lambda: dg.m_grouped_fp8_gemm_nt_masked(
            am, bc, dm, mm_copies[next(it) % len(mm_copies)], 16)),
    ]
    print(f"device: {torch.cuda.get_device_name()}  deepgemm {dg.__version__}  torch {torch.__version__}  "
          f"{n} calls per line")
    for name, fn in pieces:
        print(f"  {per_call(fn, n):7.1f} us per call  {name}")


if __name__ == "__main__":
    main()
