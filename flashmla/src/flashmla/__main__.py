"""`python -m flashmla`: one MLA decode step on built-in random data, checked against the reference.

Runs the CUDA kernel when a GPU and the compiled kernels are present, else the reference (CPU path,
checked against an independent dense computation with torch's scaled_dot_product_attention).
Prints the measured bandwidth; the last line is `summary: backend=... result=...`.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

import flashmla
from flashmla.testing import make_inputs


def _sdpa_check(q, k_cache, block_table, seqlens, causal):
    """Independent oracle for the CPU path: per request, SDPA over the gathered cache in float32."""
    outs = []
    for b in range(q.shape[0]):
        L = int(seqlens[b])
        kv = k_cache[block_table[b, : (L + 63) // 64].long()].reshape(-1, k_cache.shape[-1])[:L].float()
        qb = q[b, :, :, :].float().transpose(0, 1)                       # [h, s_q, d]
        mask = None
        if causal:
            s_q = q.shape[1]
            mask = torch.arange(L)[None, :] <= (L - s_q + torch.arange(s_q))[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(
            qb, kv[None].expand(qb.shape[0], -1, -1), kv[None, :, :512].expand(qb.shape[0], -1, -1),
            attn_mask=mask)
        outs.append(o.transpose(0, 1))
    return torch.stack(outs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flashmla", description=__doc__)
    ap.add_argument("--version", action="store_true", help="print the version and exit")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seqlen", type=int, default=None)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--s-q", type=int, default=1)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="force the reference path")
    args = ap.parse_args(argv)
    if args.version:
        print(f"flashmla {flashmla.__version__}")
        return 0
    cuda = flashmla.cuda_available() and not args.cpu
    device = "cuda" if cuda else "cpu"
    batch = args.batch or (64 if cuda else 4)
    seqlen = args.seqlen or (4096 if cuda else 700)
    lens = [max(0, seqlen - 37 * i) for i in range(batch)]
    q, kc, bt, sl = make_inputs(batch, lens, args.heads, args.s_q, device=device, seed=1)
    meta, splits = flashmla.get_mla_metadata(sl, args.s_q * args.heads, 1)
    out, lse = flashmla.flash_mla_with_kvcache(q, kc, bt, sl, 512, meta, splits, causal=args.causal)
    if cuda:
        ref_out, ref_lse = flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=args.causal)
    else:
        ref_out = _sdpa_check(q, kc, bt, sl, args.causal)
    err = (out.float() - ref_out).abs().max().item()
    ok = bool(torch.allclose(out.float(), ref_out.float(), atol=8e-4, rtol=2e-2))  # NaN fails too
    # bandwidth: bytes = 2 * (sum(seqlen) * 576 + |q| + |out|); timed without the host-side checks
    scale = 576 ** -0.5

    def step():
        return torch.ops.flashmla.mla_decode(q, kc, bt, sl, 512, meta, splits, scale, args.causal, False)

    iters = 50 if cuda else 2
    step()
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            step()
        end.record()
        torch.cuda.synchronize()
        dt = start.elapsed_time(end) * 1e-3 / iters
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        dt = (time.perf_counter() - t0) / iters
    nbytes = 2 * (sum(lens) * 576 + q.numel() + out.numel())
    gbs = nbytes / dt / 1e9
    print(f"batch={batch} h_q={args.heads} s_q={args.s_q} seqlens={lens[0]}..{lens[-1]} "
          f"max_abs_err={err:.2e} time={dt * 1e3:.3f} ms  {gbs:.1f} GB/s")
    backend = "CUDA" if cuda else "CPU"
    print(f"summary: backend={backend} result={'ok' if ok else 'MISMATCH'} err={err:.1e} {gbs:.2f}GB/s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
