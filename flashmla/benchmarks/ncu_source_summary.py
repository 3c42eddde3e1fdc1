"""Summarise Nsight Compute's source view of one kernel: where its warps stall, per SASS instruction.

    ncu --section SourceCounters --section WarpStateStats --kernel-name regex:swapab --export rep ...
    ncu --import rep.ncu-rep --page source --csv --print-source sass > src.csv
    python flashmla/benchmarks/ncu_source_summary.py src.csv [--top 25] [--role dequant=F2FP.F16.E4M3 ...]

Prints the stall reasons over all samples; per role (the address span from the first to the last instruction
whose text contains a marker, e.g. the dequantiser's F2FP conversions or the consumer's HGMMAs: approximate, the
code around the span is not counted) its share of the samples and its own breakdown; the instructions with the most samples (each with its top two reasons, and for
a `@!P BRA` right after a `SYNCS.PHASECHK` the mbarrier it polls); and the shared-memory instructions with
excess wavefronts (bank conflicts). Used in session 15 to find the swap-AB kernel's bottlenecks."""
from __future__ import annotations

import argparse
import collections
import csv
import gzip

SAMPLES, EXECUTED = "Warp Stall Sampling (All Samples)", "Instructions Executed"
EXCESS, WAVES, IDEAL = "L1 Wavefronts Shared Excessive", "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal"


def read(path: str):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[head], [r for r in rows[head + 1:] if len(r) == len(rows[head])]
    return {h: i for i, h in enumerate(hdr)}, data


def num(r, ix, key):
    v = r[ix[key]] if key in ix else ""
    return int(v.replace(",", "")) if v and v not in ("-", "") else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--role", action="append", default=[], metavar="NAME=MARKER",
                    help="a role's address span: first to last instruction containing MARKER (repeatable)")
    args = ap.parse_args()
    ix, data = read(args.csv)
    stalls = [h for h in ix if h.startswith("stall_") and "(Not Issued)" not in h]
    total = sum(num(r, ix, SAMPLES) for r in data) or 1
    addr = [int(r[ix["Address"]], 16) for r in data]

    def breakdown(rows, of):
        agg = collections.Counter()
        for r in rows:
            for s in stalls:
                agg[s] += num(r, ix, s)
        return ", ".join(f"{k[6:]} {100 * v / of:.1f}%" for k, v in agg.most_common(6) if v)

    print(f"{len(data)} instructions, {total} samples: {breakdown(data, total)}")
    for spec in args.role:
        name, marker = spec.split("=", 1)
        hits = [a for a, r in zip(addr, data) if marker in r[ix["Source"]]]
        if not hits:
            print(f"role {name}: no instruction contains {marker!r}")
            continue
        rows = [r for a, r in zip(addr, data) if min(hits) <= a <= max(hits)]
        n = sum(num(r, ix, SAMPLES) for r in rows) or 1
        print(f"role {name} [{min(hits):#x}, {max(hits):#x}]: {100 * n / total:.1f}% of samples; {breakdown(rows, n)}")
    print(f"\ntop {args.top} instructions (share of all samples, executions, top reasons):")
    order = sorted(range(len(data)), key=lambda i: -num(data[i], ix, SAMPLES))[:args.top]
    for i in order:
        r = data[i]
        why = sorted(((num(r, ix, s), s[6:]) for s in stalls), reverse=True)[:2]
        polled = ""
        if "BRA" in r[ix["Source"]]:
            prev = next((data[j][ix["Source"]].strip() for j in range(i - 1, max(i - 10, -1), -1)
                         if "SYNCS.PHASECHK" in data[j][ix["Source"]]), "")
            polled = f"  <- polls {prev.split('[', 1)[-1].split(']')[0]}" if prev else ""
        print(f"  {addr[i] & 0xfffff:#07x} {100 * num(r, ix, SAMPLES) / total:5.1f}% {num(r, ix, EXECUTED):>9} "
              f"{r[ix['Source']].strip()[:58]:58s} {', '.join(f'{s} {100 * v / total:.1f}%' for v, s in why if v)}{polled}")
    excess = [(num(r, ix, EXCESS), a, r) for a, r in zip(addr, data) if num(r, ix, EXCESS)]
    if excess:
        print("\nshared-memory instructions with excess wavefronts (actual / ideal):")
        for e, a, r in sorted(excess, key=lambda x: -x[0])[:args.top]:
            print(f"  {a & 0xfffff:#07x} {r[ix['Source']].strip()[:50]:50s} {num(r, ix, WAVES)} / {num(r, ix, IDEAL)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
