"""Benchmark of flash_mla_with_kvcache on a CUDA device, side by side with the peers in one run.

Peers: torch scaled_dot_product_attention over the gathered cache (what a user writes without us),
a Triton split-KV kernel (triton_mla.py, checked against our output before it is timed), the
plain-PyTorch reference (flashmla.mla_decode_ref), and FlashInfer's BatchMLAPagedAttentionWrapper
(flashinfer_mla.py) when `import flashinfer` works (it is not on the H200 image: device_run.sh installs
carried JIT wheels from .whl/ when present; its kernels compile on first use, outside the timing).
Bytes = 2·(Σseqlen·576 + |q| + |out|) (bf16; FP8 rows count 656 bytes per token), FLOPs =
2·h_q·s_q·Σseqlen·(576 + 512). Times are medians of CUDA-graph replays (triton do_bench_cudagraph).

    python flashmla/benchmarks/bench_decode.py [--quick] [--json PATH] [--kernels auto,default,wgmma]
        [--fp8 [--fp8-kernels default,wgmma,swapab] [--fp8-heads 8,16,32,64,128] [--fp8-only]]

--kernels times each listed kernel variant (FLASHMLA_KERNEL; auto = what a user gets, the default
of the flag; a variant may add launcher settings, e.g. wgmma+FLASHMLA_WGMMA_SPLIT=128+FLASHMLA_L2_PREFETCH=1,
or another scheduler cost auto+FLASHMLA_SPLIT_OVH=3; metadata is recomputed per variant)
on every shape; the first is "ours"
in the table, each further one gets its own columns (time, TFLOPS, speed relative to the first)
after its output was checked against the first's. --fp8 adds the FP8-cache table: BF16 cache under
the first --kernels value beside the FP8 cache under each --fp8-kernels value (default,wgmma: the
mma.sync FP8 path and the FP8 wgmma variant; swapab: the swap-AB FP8 kernel, which runs at h_q <= 32
(<= 16 with +FLASHMLA_SWAPAB_MAX_ROWS=16) and falls back to the default kernel above; auto: what a user
gets, swap-AB up to 32 rows and the FP8 wgmma kernel from 64; the "ran" column says which ran), each FP8 variant timed
after agreeing with the first. --fp8-heads sets the h_q values of that table.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import time

import torch

import flashmla
from flashmla.testing import make_inputs

COPY_BW = 4.3e12     # measured device-to-device copy on the H200 (bytes read + written per second)
BF16_PEAK = 790e12   # measured bf16 matmul rate on the H200 (cuBLAS, random data)


def bench_graph(fn, rep_ms=60):
    from triton.testing import do_bench_cudagraph
    return do_bench_cudagraph(fn, rep=rep_ms, return_mode="median") * 1e-3


def time_variants(specs, fn, rounds, rep_ms, variant=lambda k: k):
    """Median time of fn(spec) for each spec, under the settings of variant(spec), each timed once per
    round; the order rotates from round to round (a drift of clocks or memory state then favours no
    position; one round: specs in order). The launcher reads the settings at every call, so each
    spec's graph is captured under its own. Several rounds time rep_ms / 2 each. Returns {spec: seconds}."""
    times = {k: [] for k in specs}
    for r in range(rounds):
        for k in specs[r % len(specs):] + specs[:r % len(specs)]:
            use_variant(variant(k))
            torch.cuda.synchronize()
            times[k].append(bench_graph(lambda: fn(k), rep_ms=rep_ms if rounds == 1 else rep_ms // 2))
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def disagreement(got, ref, tol=1e-5):
    """None when a variant's (out, lse) agrees with the reference variant's (cosine of out > 1 - tol,
    same inf pattern in lse); else the cosine, for the message."""
    cos = torch.nn.functional.cosine_similarity(got[0].float().flatten(), ref[0].float().flatten(), dim=0).item()
    return None if cos > 1 - tol and torch.equal(torch.isinf(got[1]), torch.isinf(ref[1])) else cos


def sdpa_baseline(q, kc, bt, sl, lmax, causal):
    """Gather the pages, then one SDPA call for the whole batch. With one KV head, the s_q·h_q
    query rows of a request are folded into SDPA's query-length axis (no K/V expansion)."""
    b, s_q, h_q, d = q.shape
    nblk = (lmax + 63) // 64
    k = kc[bt[:, :nblk].long()].view(b, nblk * 64, d)[:, :lmax]                  # [b, L, d]
    k = torch.nan_to_num(k).unsqueeze(1)      # slots past each length are NaN-poisoned; masked
    pos = torch.arange(lmax, device=q.device)
    qi = torch.arange(s_q, device=q.device).repeat_interleave(h_q)                 # query of each row
    limit = sl.view(b, 1) - ((s_q - 1 - qi).view(1, -1) if causal else 0)        # [b, s_q*h_q]
    mask = (pos.view(1, 1, lmax) < limit.unsqueeze(-1)).unsqueeze(1)             # [b, 1, rows, L]
    o = torch.nn.functional.scaled_dot_product_attention(
        q.reshape(b, 1, s_q * h_q, d), k, k[..., :512], attn_mask=mask)
    return o.view(b, s_q, h_q, 512)


# launcher settings a variant may set; FLASHMLA_SPLIT_OVH is read by get_mla_metadata, which the
# bench calls again under each variant (outside the timing, like a serving step's metadata)
KNOBS = ("FLASHMLA_WGMMA_SPLIT", "FLASHMLA_L2_PREFETCH", "FLASHMLA_P_BF16_MIN_KEYS", "FLASHMLA_KSPLIT",
         "FLASHMLA_SPLIT_OVH", "FLASHMLA_SWAPAB_MAX_ROWS", "FLASHMLA_FP8_F16", "FLASHMLA_SWAPAB_RF",
         "FLASHMLA_FP8_Q", "FLASHMLA_FP8_PV")


def parse_variant(spec):
    """'wgmma+FLASHMLA_WGMMA_SPLIT=128' -> ('wgmma', {'FLASHMLA_WGMMA_SPLIT': '128'}), or None."""
    name, *sets = spec.split("+")
    env = dict(kv.split("=", 1) for kv in sets if "=" in kv)
    ok = name in ("auto", "default", "wgmma", "swapab") and len(env) == len(sets) and all(k in KNOBS for k in env)
    return (name, env) if ok else None


def use_variant(spec):
    """Sets FLASHMLA_KERNEL and the variant's launcher settings (the others unset); the launcher reads
    them at every call, so a graph captured afterwards runs this variant."""
    name, env = parse_variant(spec)
    os.environ["FLASHMLA_KERNEL"] = name
    for k in KNOBS:
        if k in env:
            os.environ[k] = env[k]
        else:
            os.environ.pop(k, None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--fp8", action="store_true", help="also time the FP8 cache")
    ap.add_argument("--fp8-kernels", default="default,wgmma",
                    help="FLASHMLA_KERNEL variants the FP8 cache is timed under (comma-separated NAME[+VAR=VALUE...] "
                         "as --kernels; swapab: the swap-AB kernel at <= 32 query rows, the default kernel above)")
    ap.add_argument("--fp8-heads", default="16,32,64,128", help="h_q values of the FP8 table (comma-separated)")
    ap.add_argument("--fp8-only", action="store_true", help="skip the BF16 table (with --fp8)")
    ap.add_argument("--compare-ksplit", action="store_true",
                    help="for s_q*h_q <= 32 also time the key-split S phase (FLASHMLA_KSPLIT=0)")
    ap.add_argument("--shapes", default=None, metavar="B;L;H;S[;KINDS]",
                    help="override the grid: batches;seqlens;h_q;s_q[;uniform,ragged] as comma lists, "
                         "e.g. '64;16384;32,64;1;uniform'")
    ap.add_argument("--no-peers", action="store_true", help="time our kernel variants only (no SDPA, Triton, "
                    "reference, FlashInfer)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time our variants (and in the FP8 table the BF16 cache) this many times each, in "
                         "rotating order, and report the median: for A/B runs, against clock drift")
    ap.add_argument("--kernels", default="auto",
                    help="comma-separated FLASHMLA_KERNEL variants to time side by side (auto, default, wgmma, swapab)")
    args = ap.parse_args()
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    bad = [k for k in kernels if parse_variant(k) is None]
    if not kernels or bad:
        ap.error(f"--kernels: expected comma-separated variants NAME[+VAR=VALUE...] with NAME in auto,default,"
                 f"wgmma,swapab and VAR in {','.join(KNOBS)}, got {args.kernels!r}")
    fp8_kernels = [k.strip() for k in args.fp8_kernels.split(",") if k.strip()]
    if not fp8_kernels or any(parse_variant(k) is None for k in fp8_kernels):
        ap.error(f"--fp8-kernels: expected comma-separated variants NAME[+VAR=VALUE...] with NAME in auto,default,"
                 f"wgmma,swapab and VAR in {','.join(KNOBS)}, got {args.fp8_kernels!r}")
    use_variant(kernels[0])
    split_ovh = flashmla.api.split_overhead_setting()   # scheduler of the first variant (fixed_cost_fit.py)
    labels = [k if len(k) <= 8 else f"var{i}" for i, k in enumerate(kernels)]
    for k, lab in zip(kernels, labels):
        if lab != k:
            print(f"{lab} = {k}")
    assert torch.cuda.is_available() and flashmla.cuda_available(), "needs CUDA and the compiled kernels"
    try:
        import flashinfer  # noqa: F401
        have_fi = True
    except ImportError:
        have_fi = False
    print(f"device: {torch.cuda.get_device_name()}  flashmla {flashmla.__version__}  flashinfer: "
          f"{'yes' if have_fi else 'not importable'}")
    batches, lens, heads, sqs = [64, 128], [1024, 4096, 8192, 16384], [16, 32, 64, 128], [1, 2]
    if args.quick:
        batches, lens, heads, sqs = [64], [4096, 16384], [16, 128], [1, 2]
    kinds = ["uniform", "ragged"]
    if args.shapes:
        parts = args.shapes.split(";")
        batches, lens, heads, sqs = ([int(x) for x in part.split(",")] for part in parts[:4])
        kinds = parts[4].split(",") if len(parts) > 4 else kinds
    if args.no_peers:
        have_fi = False
    rows = []

    def save():  # after every row, so a run cut short by a time limit keeps what it measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(device=torch.cuda.get_device_name(), flashinfer=have_fi, kernels=kernels,
                               fp8_kernels=fp8_kernels, split_ovh=split_ovh, rows=rows), f, indent=1)
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from triton_mla import triton_mla_decode
        triton_ok = True
    except ImportError as e:
        print(f"triton baseline unavailable: {e}")
        triton_ok = False
    fi_ok, fi_first = have_fi, True
    if fi_ok:
        from flashinfer_mla import FlashInferMLA
    hdr = (f"{'batch':>5} {'seqlen':>6} {'h_q':>4} {'s_q':>3} {'kind':>7} | {'ours us':>8} {'GB/s':>6} "
           f"{'TFLOPS':>6} {'%bw':>4} {'%mma':>4} | {'sdpa us':>8} {'x':>5} | {'triton':>8} {'x':>5} | "
           f"{'ref us':>8} {'x':>6} | {'flashinf':>8} {'x':>5}" + "".join(f" | {k:>8} {'TFLOPS':>6} {'speed':>5}" for k in labels[1:]))
    print(hdr)
    if args.fp8_only and not args.fp8:
        ap.error("--fp8-only needs --fp8")
    shapes = [] if args.fp8_only else itertools.product(batches, lens, heads, sqs, kinds)
    for batch, L, h_q, s_q, kind in shapes:
        rng = random.Random(batch * L + h_q * 7 + s_q)
        sl_list = [L] * batch if kind == "uniform" else [rng.randint(1, 2 * L) for _ in range(batch)]
        causal = s_q > 1
        q, kc, bt, sl = make_inputs(batch, sl_list, h_q, s_q, device="cuda", seed=1)
        scale = 576 ** -0.5
        metas = {}
        for k in kernels:   # each variant's metadata (FLASHMLA_SPLIT_OVH may differ), outside the timing
            use_variant(k)
            metas[k] = flashmla.get_mla_metadata(sl, s_q * h_q, 1)
        use_variant(kernels[0])

        def call(k):
            return torch.ops.flashmla.mla_decode(q, kc, bt, sl, 512, *metas[k], scale, causal, False)

        def ours():
            return call(kernels[0])

        out, _lse = ours()
        torch.cuda.synchronize()   # do_bench_cudagraph runs on a side stream: inputs must be ready
        timed = [kernels[0]]
        for k in kernels[1:]:   # the other variants: checked against the first before they are timed
            use_variant(k)
            cos = disagreement(call(k), (out, _lse))
            if cos is None:
                timed.append(k)
            else:
                print(f"      kernel {k} disagrees with {kernels[0]} (cosine {cos:.7f}): not timed")
        times = time_variants(timed, call, args.rounds, 40)
        use_variant(kernels[0])
        t = times[kernels[0]]
        tot = sum(sl_list)
        nbytes = 2 * (tot * 576 + q.numel() + out.numel())
        flops = 2 * h_q * s_q * tot * (576 + 512)
        rec = dict(batch=batch, seqlen=L, h_q=h_q, s_q=s_q, kind=kind, causal=causal, ours_s=t,
                   gbps=nbytes / t / 1e9, tflops=flops / t / 1e12)
        if args.compare_ksplit and s_q * h_q <= 32:
            os.environ["FLASHMLA_KSPLIT"] = "0"
            rec["ours_keysplit_s"] = bench_graph(ours, rep_ms=40)
            del os.environ["FLASHMLA_KSPLIT"]
            print(f"      (key-split S phase: {rec['ours_keysplit_s'] * 1e6:.1f} us)")
        rec["kernel"] = kernels[0]
        extra = ""
        for k in kernels[1:]:
            tk = times.get(k, float("nan"))
            rec[f"{k}_s"] = tk
            extra += f" | {tk * 1e6:8.1f} {flops / tk / 1e12:6.1f} {t / tk:5.2f}"
        rec["frac_bw"] = nbytes / t / COPY_BW
        rec["frac_mma"] = flops / t / BF16_PEAK
        lmax = max(sl_list)
        try:
            ts = float("nan") if args.no_peers else bench_graph(lambda: sdpa_baseline(q, kc, bt, sl, lmax, causal), rep_ms=20)
        except torch.OutOfMemoryError:
            ts = float("nan")
        rec["sdpa_s"] = ts
        rec["triton_s"] = float("nan")
        if triton_ok and not args.no_peers:
            try:
                to, tl_ = triton_mla_decode(q, kc, bt, sl, causal=causal)
                cos = torch.nn.functional.cosine_similarity(to.float().flatten(), out.float().flatten(), dim=0)
                if cos > 0.9999 and torch.equal(torch.isinf(tl_), torch.isinf(_lse)):
                    rec["triton_s"] = bench_graph(lambda: triton_mla_decode(q, kc, bt, sl, causal=causal), rep_ms=20)
                else:
                    print(f"      triton baseline disagrees with ours (cosine {cos.item():.6f}): not timed")
            except Exception as e:  # noqa: BLE001 - a broken peer must not stop the benchmark
                print(f"      triton baseline failed: {type(e).__name__}: {str(e)[:200]}")
                triton_ok = False
        rec["flashinfer_s"] = float("nan")
        if fi_ok:
            try:
                t0 = time.perf_counter()
                fi = FlashInferMLA(q, kc, bt, sl, causal)
                fo = fi.run()
                torch.cuda.synchronize()
                if fi_first:  # the first call compiles FlashInfer's kernels (JIT)
                    fi_first = False
                    print(f"      flashinfer first call (JIT compile + plan): {time.perf_counter() - t0:.1f} s")
                cos = torch.nn.functional.cosine_similarity(fo.float().flatten(), out.float().flatten(), dim=0)
                if cos > 0.9999:
                    rec["flashinfer_s"] = bench_graph(fi.run, rep_ms=20)
                else:
                    print(f"      flashinfer disagrees with ours (cosine {cos.item():.6f}): not timed")
                del fi, fo
            except Exception as e:  # noqa: BLE001 - a broken peer must not stop the benchmark
                print(f"      flashinfer failed: {type(e).__name__}: {str(e)[:300]}")
                fi_ok = False
        if batch == batches[0] and kind == "uniform" and not args.no_peers:   # the Python-loop reference is slow: a subset
            flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=causal)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=causal)
            torch.cuda.synchronize()
            rec["ref_s"] = time.perf_counter() - t0
        else:
            rec["ref_s"] = float("nan")
        rows.append(rec)
        save()
        print(f"{batch:>5} {L:>6} {h_q:>4} {s_q:>3} {kind:>7} | {t * 1e6:8.1f} {rec['gbps']:6.0f} "
              f"{rec['tflops']:6.1f} {100 * rec['frac_bw']:4.0f} {100 * rec['frac_mma']:4.0f} | "
              f"{ts * 1e6:8.1f} {ts / t:5.1f} | {rec['triton_s'] * 1e6:8.1f} {rec['triton_s'] / t:5.1f} | "
              f"{rec['ref_s'] * 1e6:8.0f} {rec['ref_s'] / t:6.0f} | "
              f"{rec['flashinfer_s'] * 1e6:8.1f} {rec['flashinfer_s'] / t:5.2f}{extra}", flush=True)
        del q, kc, bt, sl
        torch.cuda.empty_cache()
    if args.fp8 and flashmla.api._C.fp8_kernel():
        fk = fp8_kernels
        rounds_note = f" (medians of {args.rounds} rounds in rotating order)" if args.rounds > 1 else ""
        print(f"\nFP8 cache vs BF16 cache (uniform, s_q = 1; BF16 under FLASHMLA_KERNEL={kernels[0]}, FP8 under "
              f"{', '.join(fk)}; speed = BF16 time / FP8 time{rounds_note}; an FP8 variant is timed after its output agrees "
              f"with the first's, cosine > 1 - 1e-5; 1 - 1e-2 under FLASHMLA_FP8_Q=1 or FLASHMLA_FP8_PV=1)")
        for batch, L, h_q in itertools.product([64, 128], [4096, 16384], [int(h) for h in args.fp8_heads.split(",")]):
            q, kc, bt, sl = make_inputs(batch, L, h_q, 1, device="cuda", seed=2, poison=False)
            k8 = flashmla.quantize_kvcache(kc)
            # "bf16" (the BF16 cache under the first --kernels variant) and each FP8 variant, with its own
            # metadata (a variant may set FLASHMLA_SPLIT_OVH); the FP8 variants are checked against the first
            specs = ["bf16"] + fk
            metas, ran = {}, {}
            for k in specs:
                use_variant(kernels[0] if k == "bf16" else k)
                metas[k] = flashmla.get_mla_metadata(sl, h_q, 1)

            def call(k):
                fp8 = k != "bf16"
                return torch.ops.flashmla.mla_decode(q, k8 if fp8 else kc, bt, sl, 512, *metas[k], 576 ** -0.5,
                                                     False, fp8)
            timed, first = ["bf16"], None
            for k in fk:
                use_variant(k)
                o8, l8 = call(k)
                ran[k] = flashmla.api._C.last_kernel()
                torch.cuda.synchronize()
                if first is None:
                    first = (o8, l8)
                # (Q or P rounded to e4m3 move out by ~1e-3 in cosine: their GPU tests check them against oracles)
                cos = disagreement((o8, l8), first, 1e-2 if "FLASHMLA_FP8_Q=1" in k or "FLASHMLA_FP8_PV=1" in k else 1e-5)
                if cos is None:
                    timed.append(k)
                else:
                    print(f"      FP8 under {k} disagrees with {fk[0]} (cosine {cos:.7f}): not timed")
            times = time_variants(timed, call, args.rounds, 60, lambda k: kernels[0] if k == "bf16" else k)
            use_variant(kernels[0])
            tb = times["bf16"]
            nb8 = batch * L * 656 + 2 * (q.numel() + batch * h_q * 512)
            rec = dict(batch=batch, seqlen=L, h_q=h_q, s_q=1, kind="fp8", bf16_s=tb, bf16_kernel=kernels[0])
            line = f"{batch:>5} {L:>6} {h_q:>4}  bf16 {tb * 1e6:8.1f} us"
            for k in fk:
                tf = times.get(k, float("nan"))
                key = "fp8_s" if k == fk[0] else f"fp8_{k}_s"
                rec.update({key: tf, f"fp8_{k}_ran": ran[k], f"fp8_{k}_speedup": tb / tf, f"fp8_{k}_gbps": nb8 / tf / 1e9})
                line += f" | fp8 {k}({ran[k]}) {tf * 1e6:8.1f} us x{tb / tf:4.2f} {nb8 / tf / 1e9:6.0f} GB/s"
            rec["speedup"] = rec[f"fp8_{fk[0]}_speedup"]
            rec["fp8_gbps"] = rec[f"fp8_{fk[0]}_gbps"]
            rows.append(rec)
            save()
            print(line, flush=True)
            del q, kc, k8
            torch.cuda.empty_cache()
    save()


if __name__ == "__main__":
    main()
