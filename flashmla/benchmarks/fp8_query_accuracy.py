"""Accuracy of the FP8 cache under the register-fed swap-AB kernel in its four modes: Q's NoPE part bf16 or e4m3
(FLASHMLA_FP8_Q=1), P^T f16 or e4m3 (FLASHMLA_FP8_PV=1, 1..16 rows, requests of >= 1024 keys; here every request,
FLASHMLA_P_BF16_MIN_KEYS=0 under it, so that the short ones show it too). Each decode against the oracle of the default P
(flashmla.testing.rf_reference, Q as the mode rounds it) and against the float32 reference on the unquantised BF16
cache (what a user compares with). Prints one line per case and mode: max |out - ref|, 1 - cosine, max lse error
(absolute, relative with a floor of 1), and ||out - ref|| / ||ref|| against the oracle.
  python3 flashmla/benchmarks/fp8_query_accuracy.py"""
import itertools
import os

import torch

import flashmla
from flashmla.testing import make_inputs, rf_reference, wide_tile_cache


def errors(out, lse, ro, rl):
    o = out.float()
    cos = torch.nn.functional.cosine_similarity(o.flatten().double(), ro.flatten().double(), dim=0).item()
    fin = torch.isfinite(rl)
    d = (lse[fin] - rl[fin]).abs()
    return ((o - ro).abs().max().item(), 1 - cos, d.max().item(), (d / rl[fin].abs().clamp_min(1.0)).max().item(),
            ((o - ro).norm() / ro.norm()).item())


def main():
    os.environ["FLASHMLA_KERNEL"] = "auto"
    cols = f"{'max|dO|':>8} {'1-cos':>8} {'dlse':>8} {'rel':>8} {'|dO|/|O|':>8}"
    print(f"{'lens':>18} {'h_q':>3} {'s_q':>3} {'data':>5} {'Q':>4} {'P':>4} | vs own oracle: {cols} | vs BF16 cache: {cols}")
    worst = {}
    for lens, h_q, s_q, data in itertools.product(
            ["1,2,65,130", "1000,4097,16384,0"], [1, 16, 32], [1, 2], ["randn", "wide"]):
        if h_q * s_q > 32:  # beyond the register-fed kernel
            continue
        ls = [int(x) for x in lens.split(",")]
        q, kc, bt, sl = make_inputs(len(ls), ls, h_q, s_q, device="cuda", seed=h_q + 7 * s_q + len(lens))
        if data == "wide":
            kc = wide_tile_cache(kc, 3)
        k8 = flashmla.quantize_kvcache(kc)
        meta, splits = flashmla.get_mla_metadata(sl, s_q * h_q, 1)
        exact = flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=s_q > 1)
        for fq, fv in itertools.product("01", "01"):
            if fv == "1" and h_q * s_q > 16:  # e4m3 P^T: the 16-row tile only
                continue
            os.environ["FLASHMLA_FP8_Q"], os.environ["FLASHMLA_FP8_PV"] = fq, fv
            os.environ["FLASHMLA_P_BF16_MIN_KEYS"] = "0" if fv == "1" else "1024"  # (1024: the default)
            out, lse = flashmla.flash_mla_with_kvcache(q, k8, bt, sl, 512, meta, splits, causal=s_q > 1,
                                                       is_fp8_kvcache=True)
            assert flashmla.api._C.last_kernel() == "swapab_rf"
            own = errors(out, lse, *rf_reference(q, k8, bt, sl, s_q > 1, fp8_q=fq == "1"))
            ext = errors(out, lse, *exact)
            mode = ("e4m3" if fq == "1" else "bf16", "e4m3" if fv == "1" else "f16")
            w = worst.setdefault(mode, [0.0] * 10)
            worst[mode] = [max(a, b) for a, b in zip(w, own + ext)]
            print(f"{lens:>18} {h_q:>3} {s_q:>3} {data:>5} {mode[0]:>4} {mode[1]:>4} | "
                  + " ".join(f"{x:8.2e}" for x in own) + " | " + " ".join(f"{x:8.2e}" for x in ext))
    for (mq, mp), w in worst.items():
        print(f"worst, Q {mq}, P {mp}: own oracle " + " ".join(f"{x:8.2e}" for x in w[:5])
              + " | BF16 cache " + " ".join(f"{x:8.2e}" for x in w[5:]))


if __name__ == "__main__":
    main()
