"""What a small memset node costs inside a captured decode call: the price of zeroing a per-call counter
buffer, which a combine fused into the main kernel (the last CTA of a split request merges its partials)
would need. Times, as CUDA-graph replays (bench_decode.py's timer), the public call alone and with a
torch.zeros of --ints int32 before it, on a few BF16 shapes.

    python flashmla/benchmarks/memset_cost.py [--ints 4096]"""
from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench_cudagraph

import flashmla
from flashmla.testing import make_inputs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ints", type=int, default=4096)
    args = ap.parse_args()
    try:
        from cupy.cuda import runtime as cudart
    except ImportError:
        cudart = None
    for batch, seqlen, h_q in [(64, 4096, 16), (64, 1024, 32), (128, 1024, 128)]:
        q, kc, bt, sl = make_inputs(batch, seqlen, h_q, 1, device="cuda", seed=1)
        meta, splits = flashmla.get_mla_metadata(sl, h_q, 1)

        def call():
            return flashmla.flash_mla_with_kvcache(q, kc, bt, sl, 512, meta, splits)

        buf = torch.empty(args.ints, dtype=torch.int32, device="cuda")

        def call_with_fill():                # torch's zero_: a fill kernel
            buf.zero_()
            return call()

        def call_with_memset():              # cudaMemsetAsync: a memset node in the graph
            cudart.memsetAsync(buf.data_ptr(), 0, buf.numel() * 4, torch.cuda.current_stream().cuda_stream)
            return call()

        fns = [call, call_with_fill, call] + ([call_with_memset, call] if cudart else [])
        t = [do_bench_cudagraph(f, rep=100, return_mode="median") * 1e3 for f in fns]
        line = f"{batch} x {seqlen} x {h_q}: call {t[0]:.2f} us, with zero_() {t[1]:.2f} (+{t[1] - (t[0] + t[2]) / 2:.2f})"
        if cudart:
            line += f", with cudaMemsetAsync {t[3]:.2f} (+{t[3] - (t[2] + t[4]) / 2:.2f})"
        print(line + f"; call alone: {', '.join(f'{x:.2f}' for x in t[::2])}")


if __name__ == "__main__":
    main()
