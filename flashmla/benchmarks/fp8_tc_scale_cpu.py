"""CPU study: two FP8-cache arithmetics for cheaper dequantisation, before writing such a kernel: the scales
applied on the tensor-core side ("tc", session 16; written, measured at 0.95-0.98x and removed in session 17),
and f16 consumers ("f16", session 19, below).

Today's FP8 kernels dequantise every value on the SMs (e4m3 -> f16 -> f32, times its tile's scale, -> bf16:
about 3 instructions per value, the bound of the swap-AB kernel; BENCHMARKS.md sessions 14-16). The variant
studied here leaves the scales out of the tiles: K = e4m3 as f16 (exact, one conversion per two values), and

    S[t, h]  = sum_g s[t, g] * (K_g Q_g^T)[t, h] + (K_rope Q_rope^T)[t, h]      (g: the 4 tiles of 128 columns)
    O_g[:, h] += K_g^T  f16(P[t, h] * s[t, g] / R_g)                               (V = K's first 512 columns)

with one fp32 accumulator per tile for S (a row scale per key: in the swap-AB kernel the keys are the
accumulator rows), Q's NoPE part as f16 (scaled by a power of two per query row when it would overflow),
and P^T as four f16 planes scaled per tile by s / R_g, R_g the running maximum of the tile's scales over the
request's keys so far (O_g is rescaled by R_old / R_new when it grows, as by alpha when the max grows; the
planes stay in [0, 1]). This replays that arithmetic in float32 page by page (64 keys) and compares it with
the reference on the bf16-dequantised cache (the GPU tests' oracle, tests/test_kernel_gpu.py) and on the
float32-dequantised cache (e4m3 x scale rounded to float32: dequantize_kvcache(..., torch.float32)), beside today's arithmetic (bf16 K; P as bf16, or as
bf16 hi + lo planes for requests under 1024 keys, as the kernels do); the
tolerances are the GPU tests' (out 8e-4 abs + 2e-2 rel, cosine > 1 - 1e-5, lse 1e-5 relative). Cases: the
swap-AB sweep's shapes (batch {1, 7}, 1..4097 keys, <= 32 query rows, causal at s_q > 1) on randn data, plus
caches whose tiles' magnitudes span 1e-5..3 (flashmla.testing.wide_tile_cache). Not a GPU benchmark.

"f16": S and P V as f16 wgmma, the NoPE part of K = V dequantised as f16(f16(e4m3) * f16(scale)) (one
cvt.rn.f16x2.e4m3x2 and one HMUL2 per two values, against today's ~6: e4m3 -> f16 -> f32, two FMUL, a bf16
pack), Q's NoPE part as f16 (a power of two per row against overflow, as "tc"; the kernel, FLASHMLA_FP8_F16=1,
takes one per 64-row tile), the RoPE part in bf16 as today, P as f16 (hi + lo planes under
1024 keys). A scale that is not a normal f16 or could overflow (448 x scale > 65504) is applied in float32
instead (a guarded path). Its oracle is the reference on the cache
dequantised the same way (f16_dequantized): the lse tolerance of 1e-5 only holds against a reference that
rounds K as the kernel does, which is also why today's kernels are checked against the bf16-dequantised one.

    python flashmla/benchmarks/fp8_tc_scale_cpu.py [--json PATH] [--quick]     (a few minutes on one core)
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import random

import torch

from flashmla import ref
from flashmla.quant import dequantize_kvcache, quantize_kvcache, split_kvcache
from flashmla.testing import f16_dequantized, f16_nope, make_inputs, wide_tile_cache


def split_cache(k8):
    """uint8 [..., 656] -> e4m3 values (float32, exact) [..., 512], scales [..., 4], RoPE (float32) [..., 64]."""
    e, s, rope = split_kvcache(k8)
    return e, s, rope.float()


def emulate(q, k8, bt, sl, causal, mode):
    """out (bf16-rounded, float32) [batch, s_q, h_q, 512] and lse [batch, h_q, s_q] of the kernel arithmetic
    `mode`: "tc" (scales on the tensor-core side, f16 K and P planes), "f16" (f16 consumers) or "today"
    (bf16 K; bf16 P, hi + lo planes under 1024 keys)."""
    batch, s_q, h_q, d = q.shape
    m = s_q * h_q
    out = torch.zeros(batch, s_q, h_q, 512)
    lse = torch.full((batch, h_q, s_q), math.inf)
    scale = d ** -0.5 * math.log2(math.e)
    for b in range(batch):
        L = int(sl[b])
        if L == 0:
            continue
        n = (L + 63) // 64
        pages = k8[bt[b, :n].long()].reshape(n * 64, -1)
        e, s, rope = split_cache(pages)
        dead = torch.arange(n * 64) >= L   # the dequantisers write zeros there (bytes and scales)
        e[dead], s[dead], rope[dead] = 0.0, 0.0, 0.0
        qb = q[b].reshape(m, d).float()
        if mode != "today":
            # Q NoPE as f16: rows whose magnitude would overflow are scaled down by a power of two
            qmax = qb[:, :512].abs().amax(1)
            qexp = torch.clamp(torch.ceil(torch.log2(qmax.clamp_min(1e-30) / 32768.0)), min=0.0)
            qn = (qb[:, :512] * torch.exp2(-qexp)[:, None]).half().float()
            k16 = e.half().float()          # exact: every e4m3 value is an f16 value
        if mode == "f16":
            # f16 consumers: K = V = f16(f16(e4m3) * f16(scale)), i.e. cvt.rn.f16x2.e4m3x2 and one HMUL2 per
            # two values (float32 scale and product where the scale is not a safe f16)
            kh = f16_nope(e, s)
        elif mode == "today":
            kb = torch.cat([(e.view(-1, 4, 128) * s[..., None]).flatten(1), rope], 1).bfloat16().float()
        lim = torch.full((m,), L)
        if causal:
            lim = L - s_q + 1 + torch.arange(s_q).repeat_interleave(h_q)
        mrow = torch.full((m,), -math.inf)
        lsum = torch.zeros(m)
        o = torch.zeros(4, 128, m) if mode == "tc" else torch.zeros(512, m)
        rg = torch.zeros(4)             # running maximum of each tile's scales
        for p0 in range(0, n * 64, 64):
            sl_ = slice(p0, p0 + 64)
            if mode == "f16":
                sp = (kh[sl_] @ qn.T) * torch.exp2(qexp)[None] + rope[sl_] @ qb[:, 512:].T
            elif mode == "tc":
                acc = torch.stack([k16[sl_, g * 128:(g + 1) * 128] @ qn[:, g * 128:(g + 1) * 128].T for g in range(4)])
                sp = (acc * s[sl_].T[:, :, None]).sum(0) * torch.exp2(qexp)[None] + rope[sl_] @ qb[:, 512:].T
            else:
                sp = kb[sl_] @ qb.T                                     # [64 keys, m]
            sp = sp * scale
            keys = torch.arange(p0, p0 + 64)[:, None]
            sp = sp.masked_fill(keys >= lim[None], -math.inf)
            mn = torch.maximum(mrow, sp.amax(0))
            mu = torch.where(torch.isneginf(mn), torch.zeros_like(mn), mn)
            alpha = torch.exp2(mrow - mu)
            mrow = mn
            p = torch.exp2(sp - mu)                                     # [64, m]
            lsum = lsum * alpha + p.sum(0)
            if mode == "tc":
                rnew = torch.maximum(rg, s[sl_].amax(0))
                ratio = torch.where(rg > 0, rg / rnew.clamp_min(1e-38), torch.ones_like(rg))
                rg = rnew
                for g in range(4):
                    if rg[g] == 0:
                        continue
                    plane = (p * (s[sl_, g] / rg[g])[:, None]).half().float()       # [64, m], in [0, 1]
                    o[g] = o[g] * (alpha[None] * ratio[g]) + k16[sl_, g * 128:(g + 1) * 128].T @ plane
            elif mode == "f16":
                hi = p.half().float()
                pr = hi + (p - hi).half().float() if L < 1024 else hi
                o = o * alpha[None] + kh[sl_].T @ pr
            else:
                hi = p.bfloat16().float()
                pr = hi + (p - hi).bfloat16().float() if L < 1024 else hi
                o = o * alpha[None] + kb[sl_, :512].T @ pr
        ot = (o * rg[:, None, None]).reshape(512, m) if mode == "tc" else o
        res = torch.where(lsum[None] > 0, ot / lsum.clamp_min(1e-38)[None], torch.zeros_like(ot)).T
        out[b] = res.bfloat16().float().view(s_q, h_q, 512)
        lb = torch.where(lsum > 0, (mrow + torch.log2(lsum.clamp_min(1e-38))) * math.log(2.0), torch.full_like(lsum, math.inf))
        lse[b] = lb.view(s_q, h_q).T
    return out, lse


def compare(o, lse, ro, rl):
    """(elements outside 8e-4 + 2e-2 |ref|, 1 - cosine, worst lse relative error) against a reference."""
    bad = int(((o - ro).abs() > 8e-4 + 2e-2 * ro.abs()).sum())
    cos = 1.0
    if ro.abs().sum() > 0:
        cos = torch.nn.functional.cosine_similarity(o.flatten().double(), ro.flatten().double(), dim=0).item()
    fin = torch.isfinite(rl)
    err = ((lse[fin] - rl[fin]).abs() / rl[fin].abs().clamp_min(1.0)).max().item() if fin.any() else 0.0
    return bad, 1 - cos, err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="a few cases only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lens_set = [1, 65, 4097] if args.quick else [1, 63, 64, 65, 1024, 4097]
    heads = [(16, 1), (32, 1), (8, 2)] if args.quick else [(1, 1), (8, 1), (16, 1), (32, 1), (8, 2), (16, 2), (5, 3)]
    cases = [(batch, L, hq, sq, data) for batch, L, (hq, sq), data in
             itertools.product([1, 7], lens_set, heads, ["randn", "wide"])]
    modes = ("tc", "f16", "today")
    names = [(a, b) for a in modes for b in ("bf16ref", "fp32", "f16ref")]
    res = {f"{a} vs {b}": dict(failing_cases=0, bad_elements=0, max_one_minus_cos=0.0, max_lse_rel=0.0)
           for a, b in names}
    per_data = {d: {k: 0 for k in res} for d in ("randn", "wide")}
    for batch, L, h_q, s_q, data in cases:
        seed = (batch * 1000003 + L * 101 + h_q * 7 + s_q) % 10000
        rng = random.Random(seed)
        lens = [L] + [rng.randint(0, L) for _ in range(batch - 1)]
        causal = s_q > 1
        q, kc, bt, sl = make_inputs(batch, lens, h_q, s_q, seed=seed)
        if data == "wide":
            kc = wide_tile_cache(kc, seed)
        k8 = quantize_kvcache(kc)
        refs = {"bf16ref": ref.mla_decode_ref(q, dequantize_kvcache(k8), bt, sl, 512, causal=causal),
                "fp32": ref.mla_decode_ref(q, dequantize_kvcache(k8, torch.float32), bt, sl, 512, causal=causal),
                "f16ref": ref.mla_decode_ref(q, f16_dequantized(k8), bt, sl, 512, causal=causal)}
        outs = {mode: emulate(q, k8, bt, sl, causal, mode) for mode in modes}
        for a, b in names:
            bad, omc, lerr = compare(*outs[a], *refs[b])
            r = res[f"{a} vs {b}"]
            fail = bad > 0 or omc >= 1e-5 or lerr >= 1e-5
            r["failing_cases"] += int(fail)
            per_data[data][f"{a} vs {b}"] += int(fail)
            r["bad_elements"] += bad
            r["max_one_minus_cos"] = max(r["max_one_minus_cos"], omc)
            r["max_lse_rel"] = max(r["max_lse_rel"], lerr)
    print(f"{len(cases)} cases (batch {{1, 7}} x {len(lens_set)} lengths x {len(heads)} (h_q, s_q) x randn / wide-range tiles)")
    for k, r in res.items():
        print(f"{k:>16}: {r['failing_cases']:3d} failing ({per_data['randn'][k]} randn, {per_data['wide'][k]} wide), "
              f"{r['bad_elements']:5d} elements outside 8e-4 + 2e-2|ref|, worst 1 - cos {r['max_one_minus_cos']:.1e}, "
              f"worst lse rel {r['max_lse_rel']:.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(cases=len(cases), results=res, failing_by_data=per_data), f, indent=1)


if __name__ == "__main__":
    main()
