"""Where a decode call's time goes under sustained load: per-kernel CUDA time (torch.profiler) and the SM clock
and power that nvidia-smi reports while the same call runs back to back.

    python flashmla/benchmarks/clock_probe.py [--cases bf16:64:16384:128:1,...] [--seconds 4] [--peer flashinfer]
    python flashmla/benchmarks/clock_probe.py --eager [--cases ...]

A case is CACHE:BATCH:SEQLEN:H_Q:S_Q (uniform lengths). Per case, after a check against the reference (cosine
> 1 - 1e-5): one call on a rested card (2 s idle; an idle H200 reports a 345 MHz SM clock, so this includes the
ramp), then a CUDA graph of 20 calls of the custom op replayed back to back (as bench_decode.py times them): one
warm-up second, then --seconds while nvidia-smi samples every 50 ms, then 60 calls under torch.profiler (after
an idle moment: those kernel times run at a recovered clock). Prints time, TFLOPS and TB/s (bench_decode.py's
byte count; for fp8 cases the FP8 cache's own bytes since session 26) per call, the median SM clock / power /
temperature, the clock event reasons nvidia-smi reports active mid-loop, and each kernel's time. --peer
flashinfer does the same for FlashInfer's MLA decode on the same inputs (BF16 cases, when flashinfer imports), to
compare power and clock at equal work. --eager: host-bound eager calls instead (eager_cost). BENCHMARKS.md
session 20."""
from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch

import flashmla
from flashmla.testing import make_inputs

QUERY = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"


def smi_samples(seconds: float, work) -> list[list[float]]:
    proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "50"],
                            stdout=subprocess.PIPE, text=True)
    end = time.time() + seconds
    while time.time() < end:
        work()
    torch.cuda.synchronize()
    proc.terminate()
    rows = [line.split(",") for line in proc.communicate()[0].splitlines()]
    return [[float(v) for v in r] for r in rows if len(r) == 5 and all(v.strip() for v in r)]


def sustained(label: str, fn, seconds: float, flops: float, nbytes: float) -> None:
    """fn (one decode call) on a rested card, then back to back while nvidia-smi samples; prints one report."""
    def capture(n):
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for _ in range(n):
                fn()
        return g

    graph, single = capture(20), capture(1)                   # 20 calls back to back, as bench_decode times them

    def loop(n=20):
        for _ in range(n // 20):
            graph.replay()

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    time.sleep(2.0)                                           # one call after an idle GPU, as ncu sees it
    start.record()
    single.replay()
    stop.record()
    torch.cuda.synchronize()
    idle_call = start.elapsed_time(stop) * 1e3
    smi_samples(1.0, loop)                                    # warm-up to a steady clock
    perf = subprocess.Popen("sleep 1; nvidia-smi -q -d PERFORMANCE", shell=True, stdout=subprocess.PIPE, text=True)
    calls = [0]

    def counted():
        loop()
        calls[0] += 20

    start.record()
    samples = smi_samples(seconds, counted)
    stop.record()
    torch.cuda.synchronize()
    per_call = start.elapsed_time(stop) * 1e3 / calls[0]
    reasons = [" ".join(ln.split()) for ln in perf.communicate()[0].splitlines() if ln.strip().endswith(": Active")]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        loop(60)
        torch.cuda.synchronize()
    kern = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            kern.setdefault(ev.name, []).append(getattr(ev, "device_time", None) or ev.cuda_time)
    med = [statistics.median(col) for col in zip(*samples)] if samples else [float("nan")] * 5
    rate = lambda us: f"{flops / us / 1e6:.0f} TFLOPS, {nbytes / us / 1e6:.2f} TB/s"
    print(f"{label}: one call after 2 s idle {idle_call:.1f} us ({rate(idle_call)}); "
          f"{per_call:.1f} us per call back to back ({rate(per_call)}); "
          f"SM clock {med[0]:.0f} of {med[1]:.0f} MHz, {med[2]:.0f} of {med[3]:.0f} W, {med[4]:.0f} C "
          f"(medians of {len(samples)} samples)")
    print(f"    clock event reasons active during the loop: {', '.join(reasons) or 'none'}")
    for name, ts in sorted(kern.items(), key=lambda kv: -sum(kv[1])):
        print(f"    {sum(ts) / 60:8.1f} us per call  {len(ts) / 60:.0f}x  {name[:90]}")


def run_case(spec: str, seconds: float, peer: str | None) -> None:
    cache, batch, seqlen, h_q, s_q = spec.split(":")
    batch, seqlen, h_q, s_q = int(batch), int(seqlen), int(h_q), int(s_q)
    q, kc, bt, sl = make_inputs(batch, seqlen, h_q, s_q, device="cuda", seed=batch + seqlen + h_q)
    fp8 = cache == "fp8"
    cache_t = flashmla.quantize_kvcache(kc) if fp8 else kc
    meta, splits = flashmla.get_mla_metadata(sl, s_q * h_q, 1)
    out, _ = flashmla.flash_mla_with_kvcache(q, cache_t, bt, sl, 512, meta, splits, causal=s_q > 1,
                                             is_fp8_kvcache=fp8)
    ref_k = flashmla.dequantize_kvcache(cache_t) if fp8 else kc
    ro, _ = flashmla.mla_decode_ref(q, ref_k, bt, sl, 512, causal=s_q > 1)
    cos = lambda o: torch.nn.functional.cosine_similarity(o.float().flatten(), ro.float().flatten(), dim=0).item()
    if not cos(out) > 1 - 1e-5:
        raise SystemExit(f"{spec}: output disagrees with the reference (cosine {cos(out)})")
    flops = 2 * h_q * s_q * batch * seqlen * (576 + 512)
    # bench_decode.py's count: 2 bytes per element of a BF16 cache, 656 per token of an FP8 one
    nbytes = (656 if fp8 else 2 * 576) * batch * seqlen + 2 * (q.numel() + out.numel())
    sustained(f"{spec} ours", lambda: torch.ops.flashmla.mla_decode(q, cache_t, bt, sl, 512, meta, splits,
                                                                    576 ** -0.5, s_q > 1, fp8),
              seconds, flops, nbytes)
    if peer == "flashinfer" and not fp8:
        from flashinfer_mla import FlashInferMLA
        fi = FlashInferMLA(q, kc, bt, sl, s_q > 1)
        fi.run()
        if not cos(fi.out.view(out.shape)) > 1 - 1e-5:
            raise SystemExit(f"{spec}: FlashInfer disagrees with the reference (cosine {cos(fi.out.view(out.shape))})")
        sustained(f"{spec} flashinfer", fi.run, seconds, flops, nbytes)


def eager_cost(spec: str, calls: int = 61) -> None:
    """Eager calls (no graph) of one case, as a model's layers make them in one decode step: with the same
    cache_seqlens tensor each time (its values checked once) and with a fresh copy each time (checked, and so
    synced, at every call)."""
    cache, batch, seqlen, h_q, s_q = spec.split(":")
    batch, seqlen, h_q, s_q = int(batch), int(seqlen), int(h_q), int(s_q)
    q, kc, bt, sl = make_inputs(batch, seqlen, h_q, s_q, device="cuda", seed=1)
    cache_t = flashmla.quantize_kvcache(kc) if cache == "fp8" else kc
    meta, splits = flashmla.get_mla_metadata(sl, s_q * h_q, 1)
    copies = [sl.clone() for _ in range(calls)]
    for name, lens in (("same tensor", [sl] * calls), ("fresh tensor per call", copies)):
        for _ in range(2):                                    # the second pass is timed
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for s in lens:
                flashmla.flash_mla_with_kvcache(q, cache_t, bt, s, 512, meta, splits, causal=s_q > 1,
                                                is_fp8_kvcache=cache == "fp8")
            torch.cuda.synchronize()
        print(f"{spec} eager, {calls} calls, {name}: {(time.perf_counter() - t0) / calls * 1e6:.1f} us per call")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="bf16:64:16384:128:1,bf16:128:16384:128:2,bf16:64:16384:64:1,bf16:64:4096:16:1")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--eager", action="store_true", help="instead: eager calls with and without the checked lengths")
    ap.add_argument("--peer", choices=["flashinfer"], default=None,
                    help="also FlashInfer's MLA decode on the same inputs (BF16 cases; flashinfer importable)")
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}  flashmla {flashmla.__version__}")
    for spec in args.cases.split(","):
        eager_cost(spec) if args.eager else run_case(spec, args.seconds, args.peer)


if __name__ == "__main__":
    main()
