"""One decode call on built-in random data, checked against the reference: the unit a sanitizer run instruments
(`compute-sanitizer --tool racecheck python3 flashmla/benchmarks/decode_case.py --h-q 33 --s-q 3 --causal`).
The kernel is the launcher's choice (FLASHMLA_KERNEL and the other switches apply). Exit status 1 when the
output misses the tests' tolerances."""
import argparse
import sys

import flashmla
from flashmla.testing import check_decode, fp8_reference, make_inputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--h-q", type=int, default=64)
    ap.add_argument("--s-q", type=int, default=1)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--lens", default="0,1,2,3,64,65,300,5000,0,17",
                    help="keys per request, comma-separated; NxL: N requests of L keys")
    ap.add_argument("--fp8", action="store_true", help="the FP8 cache (checked against the oracle of the FP8 kernel that ran)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", help="cpu: the reference path against itself (a check of this script)")
    args = ap.parse_args()
    lens = [int(x) for x in args.lens.split(",")] if "x" not in args.lens else \
        [int(args.lens.split("x")[1])] * int(args.lens.split("x")[0])
    q, kc, bt, sl = make_inputs(len(lens), lens, args.h_q, args.s_q, device=args.device, seed=args.seed)
    cache = flashmla.quantize_kvcache(kc) if args.fp8 else kc
    meta, splits = flashmla.get_mla_metadata(sl, args.s_q * args.h_q, 1)
    out, lse = flashmla.flash_mla_with_kvcache(q, cache, bt, sl, 512, meta, splits, causal=args.causal,
                                               is_fp8_kvcache=args.fp8)
    ro, rl = fp8_reference(q, cache, bt, sl, args.causal) if args.fp8 else \
        flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=args.causal)
    err = (out.float() - ro.float()).abs().max().item()
    try:
        check_decode(out, lse, ro, rl)
        verdict = "ok"
    except AssertionError as e:
        verdict = f"MISMATCH ({str(e).splitlines()[0] if str(e) else 'inf/NaN pattern or dtype'})"
    print(f"h_q {args.h_q} s_q {args.s_q} causal {args.causal} fp8 {args.fp8} lens {args.lens}: "
          f"max |out - ref| {err:.2e}, {verdict}")
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
