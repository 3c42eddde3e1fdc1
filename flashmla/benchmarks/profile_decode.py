"""One decode call per case, for Nsight Compute (ncu) to profile; nothing is timed here.

    python flashmla/benchmarks/profile_decode.py --cases fp8:64:16384:128,bf16:64:16384:128

A case is CACHE:BATCH:SEQLEN:H_Q (s_q = 1, uniform lengths). Each case runs twice: a warm-up call
(module load, metadata) and the call to profile, between cudaProfilerStart/Stop, so that
`ncu --profile-from-start off` sees only the second call's kernels (main kernel and combine).
The output is checked against the reference on the same inputs (cosine > 1 - 1e-5) before the
profiled call, so a profile of a wrong kernel is not mistaken for a slow one.
"""
from __future__ import annotations

import argparse

import torch

import flashmla
from flashmla.testing import make_inputs


def run_case(spec: str) -> None:
    cache, batch, seqlen, h_q = spec.split(":")
    batch, seqlen, h_q = int(batch), int(seqlen), int(h_q)
    if cache not in ("bf16", "fp8"):
        raise ValueError(f"--cases: cache must be bf16 or fp8, got {cache!r} in {spec!r}")
    q, kc, bt, sl = make_inputs(batch, seqlen, h_q, device="cuda", seed=batch + seqlen + h_q)
    fp8 = cache == "fp8"
    cache_t = flashmla.quantize_kvcache(kc) if fp8 else kc
    meta, splits = flashmla.get_mla_metadata(sl, h_q, 1)
    call = lambda: flashmla.flash_mla_with_kvcache(q, cache_t, bt, sl, 512, meta, splits, is_fp8_kvcache=fp8)
    out, _ = call()
    ref_cache = flashmla.dequantize_kvcache(cache_t) if fp8 else kc
    ref, _ = flashmla.mla_decode_ref(q, ref_cache, bt, sl, 512)
    cos = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.float().flatten(), dim=0).item()
    if not cos > 1 - 1e-5:
        raise SystemExit(f"{spec}: output disagrees with the reference (cosine {cos:.8f})")
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"{spec}: ok (cosine {cos:.8f})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="fp8:64:16384:128,bf16:64:16384:128,fp8:64:16384:64,fp8:64:16384:16")
    for spec in ap.parse_args().cases.split(","):
        run_case(spec)


if __name__ == "__main__":
    main()
