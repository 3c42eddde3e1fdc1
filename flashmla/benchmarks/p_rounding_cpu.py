"""CPU study: how P (the softmax numerators) must be rounded before P·V to meet the test tolerances.

The wgmma kernel multiplies P by V on the tensor cores, so P enters as bf16. This script replays the
kernel's arithmetic on the CPU in float32 (page by page: S = Q K^T, masked, online softmax in the
exp2 domain, running max per page, O = alpha·O + round(P) V, l summed from the unrounded P) with
round = bf16 ("bf16") or bf16 hi + bf16 lo ("hilo"), over the shapes of tests/test_kernel_gpu.py
(batch {1, 7}, lengths up to 4097), and counts elements outside the GPU tests' tolerance
(8e-4 abs + 2e-2 rel) and the worst 1 - cosine. Not a GPU benchmark (ci/gpu does not run it).

    python flashmla/benchmarks/p_rounding_cpu.py [--json PATH]     (about 1-2 minutes on one core)
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import random

import torch

from flashmla import ref
from flashmla.testing import make_inputs


def emulate(q, kc, bt, sl, causal, mode):
    """out float32 [batch, s_q, h_q, 512] (bf16-rounded as the kernel stores it)."""
    batch, s_q, h_q, d = q.shape
    m = s_q * h_q
    out = torch.zeros(batch, s_q, h_q, 512)
    scale = d ** -0.5 * math.log2(math.e)
    for b in range(batch):
        L = int(sl[b])
        if L == 0:
            continue
        kv = kc[bt[b, :(L + 63) // 64].long()].reshape(-1, d)[:L].float()
        s = (q[b].reshape(m, d).float() @ kv.T) * scale
        if causal:
            lim = L - s_q + 1 + torch.arange(s_q).repeat_interleave(h_q)
            s = s.masked_fill(torch.arange(L)[None] >= lim[:, None], -math.inf)
        mrow = torch.full((m, 1), -math.inf)
        lsum = torch.zeros(m, 1)
        o = torch.zeros(m, 512)
        for p0 in range(0, L, 64):
            sp = s[:, p0:p0 + 64]
            mn = torch.maximum(mrow, sp.amax(1, keepdim=True))
            mu = torch.where(torch.isneginf(mn), torch.zeros_like(mn), mn)
            alpha = torch.exp2(mrow - mu)
            mrow = mn
            p = torch.exp2(sp - mu)
            hi = p.bfloat16().float()
            pr = hi if mode == "bf16" else hi + (p - hi).bfloat16().float()
            lsum = lsum * alpha + p.sum(1, keepdim=True)
            o = o * alpha + pr @ kv[p0:p0 + 64, :512]
        out[b] = torch.where(lsum > 0, o / lsum, torch.zeros_like(o)).view(s_q, h_q, 512)
    return out.bfloat16().float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cases = list(itertools.product([1, 7], [1, 63, 64, 65, 1024, 4097], [1, 16, 64, 128], [1, 2]))
    res = {mode: dict(bad_elements=0, failing_cases=0, max_one_minus_cos=0.0) for mode in ("bf16", "hilo")}
    for batch, seqlen, h_q, s_q in cases:
        seed = hash((batch, seqlen, h_q, s_q)) % 10000   # as in test_decode_sweep
        rng = random.Random(seed)
        lens = [seqlen] + [rng.randint(0, seqlen) for _ in range(batch - 1)]
        causal = s_q > 1 and seed % 2 == 0
        q, kc, bt, sl = make_inputs(batch, lens, h_q, s_q, seed=seed)
        ro, _ = ref.mla_decode_ref(q, kc, bt, sl, 512, causal=causal)
        for mode, r in res.items():
            o = emulate(q, kc, bt, sl, causal, mode)
            bad = int(((o - ro).abs() > 8e-4 + 2e-2 * ro.abs()).sum())
            cos = 1.0
            if ro.abs().sum() > 0:
                cos = torch.nn.functional.cosine_similarity(o.flatten().double(), ro.flatten().double(), dim=0).item()
            r["bad_elements"] += bad
            r["failing_cases"] += int(bad > 0 or cos <= 1 - 1e-5)
            r["max_one_minus_cos"] = max(r["max_one_minus_cos"], 1 - cos)
    print(f"{len(cases)} cases (batch {{1, 7}} x seqlen {{1..4097}} x h_q {{1..128}} x s_q {{1, 2}})")
    for mode, r in res.items():
        print(f"P as {mode:>4}: {r['failing_cases']:3d} failing cases, {r['bad_elements']:5d} elements outside "
              f"8e-4 + 2e-2·|ref|, worst 1 - cosine {r['max_one_minus_cos']:.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(cases=len(cases), results=res), f, indent=1)


if __name__ == "__main__":
    main()
