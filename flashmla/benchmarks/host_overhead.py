"""Host time of one eager flash_mla_with_kvcache call, piece by piece, on a case whose kernels take a few us (so
the CPU, not the GPU, sets the pace).

    python flashmla/benchmarks/host_overhead.py [--case bf16:1:64:16:1] [--calls 2000]

Each line is the mean wall time per call of N calls in a row, then one sync: the public call; its input checks
(`_validate`, the lengths' values checked once for the unchanged tensor); the body through the custom op's dispatch
(what torch.compile and opcheck use) and the same body called directly (what eager calls run); the four output
and partial-buffer allocations alone; and the extension's launch (`_C.mla_decode`: launch settings, tensor maps,
the main and combine kernels) into preallocated buffers."""
from __future__ import annotations

import argparse
import time

import torch

import flashmla
from flashmla import api
from flashmla.testing import make_inputs


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
    ap.add_argument("--case", default="bf16:1:64:16:1", help="CACHE:BATCH:SEQLEN:H_Q:S_Q")
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    cache, batch, seqlen, h_q, s_q = args.case.split(":")
    batch, seqlen, h_q, s_q = int(batch), int(seqlen), int(h_q), int(s_q)
    fp8 = cache == "fp8"
    q, kc, bt, sl = make_inputs(batch, seqlen, h_q, s_q, device="cuda", seed=1)
    kc = flashmla.quantize_kvcache(kc) if fp8 else kc
    meta, splits = flashmla.get_mla_metadata(sl, s_q * h_q, 1)
    scale, causal, parts, m = 576 ** -0.5, s_q > 1, meta.shape[0], s_q * h_q
    body = (q, kc, bt, sl, 512, meta, splits, scale, causal, fp8)
    out = torch.empty(batch, s_q, h_q, 512, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, h_q, s_q, dtype=torch.float32, device=q.device)
    oacc = torch.empty(batch + parts, m, 512, dtype=torch.float32, device=q.device)
    lacc = torch.empty(batch + parts, m, dtype=torch.float32, device=q.device)

    def allocs():
        torch.empty(batch, s_q, h_q, 512, dtype=q.dtype, device=q.device)
        torch.empty(batch, h_q, s_q, dtype=torch.float32, device=q.device)
        torch.empty(batch + parts, m, 512, dtype=torch.float32, device=q.device)
        torch.empty(batch + parts, m, dtype=torch.float32, device=q.device)

    def launch():
        api._C.mla_decode(q.data_ptr(), kc.data_ptr(), kc.stride(0), kc.shape[0], int(fp8), bt.data_ptr(),
                          bt.stride(0), bt.shape[1], sl.data_ptr(), meta.data_ptr(), parts, splits.data_ptr(),
                          out.data_ptr(), lse.data_ptr(), oacc.data_ptr(), lacc.data_ptr(), batch, s_q, h_q,
                          scale, int(causal), torch.cuda.current_stream().cuda_stream)

    pieces = [
        ("flash_mla_with_kvcache (public, eager)", lambda: flashmla.flash_mla_with_kvcache(
            q, kc, bt, sl, 512, meta, splits, causal=causal, is_fp8_kvcache=fp8)),
        ("input checks (_validate)", lambda: api._validate(q, kc, bt, sl, 512, meta, splits, fp8)),
        ("body through the custom op (torch.ops dispatch)", lambda: api._decode_op(*body)),
        ("body called directly (_decode_impl)", lambda: api._decode_impl(*body)),
        ("four torch.empty", allocs),
        ("_C.mla_decode into preallocated buffers", launch),
    ]
    print(f"device: {torch.cuda.get_device_name()}  flashmla {flashmla.__version__}  torch {torch.__version__}  "
          f"case {args.case}, {args.calls} calls per line")
    for name, fn in pieces:
        print(f"  {per_call(fn, args.calls):7.1f} us per call  {name}")


if __name__ == "__main__":
    main()
