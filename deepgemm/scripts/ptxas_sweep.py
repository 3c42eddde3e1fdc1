"""Compile every kernel configuration that the gpu tests, scripts/repro_masked.py and
`bench_gemm.py --compare` (K split, small-M BN, swap-AB, pipelining, multicast switches) build, through deepgemm's JIT with the
nvcc backend, and summarise ptxas' report (registers, spills, stack) per kernel family. CPU only.
    python deepgemm/scripts/ptxas_sweep.py [--json PATH]
"""
import argparse
import collections
import itertools
import json
import os
import re
import tempfile

os.environ.setdefault("DEEPGEMM_CACHE_DIR", tempfile.mkdtemp(prefix="dgsweep-"))
import torch  # noqa: E402

from deepgemm.jit import compiler, kernels as K  # noqa: E402

NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def configs():
    cases = [("dense", n, k, m, 1) for m in (1, 5, 16, 64, 128, 4096) for n, k in NK]
    cases += [("masked", n, k, mg, g) for n, k in [(4096, 7168), (7168, 2048)]
              for g, mg in [(1, 256), (8, 64), (32, 64), (32, 32), (32, 256), (8, 16), (32, 8), (4, 12)]]
    cases += [("dense", 2112, 7168, 1000, 1), ("dense", 4096, 384, 3, 1), ("dense", 2112, 128, 40, 1)]
    out = set()
    for (kind, n, k, m, g), epi, ks, bn, sw, pipe, mc, sms, dt in itertools.product(
            cases, ("staged", "direct"), ("0", "1"), ("fill", "pow2"), ("0", "1", "2"), ("0", "1"), ("0", "1"),
            (132, 77), (torch.bfloat16, torch.float32)):
        out.add(K._make_config(kind, True, dt, None, n, k, m, g, sms, epi, ks, bn, sw, pipe, mc))
    # DEEPGEMM_BN256=1 (FP8 128 x 256 tiles at M > 128, grouped contiguous included) and DEEPGEMM_TMA_STORE=1
    wide = cases + [("contiguous", n, k, 32768, 1) for n, k in [(4096, 7168), (7168, 2048)]]
    for (kind, n, k, m, g), epi, sms, dt, w, ts in itertools.product(
            wide, ("staged", "direct"), (132, 77), (torch.bfloat16, torch.float32), ("0", "1", "2"), ("0", "1")):
        out.add(K._make_config(kind, True, dt, None, n, k, m, g, sms, epi, "1", bn256_env=w, tstore_env=ts))
    return sorted(out, key=lambda c: tuple(c.__dict__.values()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    only = os.environ.get("SWEEP_ONLY")  # e.g. "pipe": the pipelined kernels; "wide": 128 x 256; "tstore": TMA store
    for cfg in configs():
        if only and not (cfg.bn > 128 if only == "wide" else getattr(cfg, only)):
            continue
        _, rec = compiler.build("deepgemm_kernel", K.kernel_source(cfg), backend="nvcc")
        rows.append(dict(cfg=cfg.__dict__, threads=cfg.threads, serialised="C75" in rec.ptxas,
                         regs=int(re.search(r"Used (\d+) registers", rec.ptxas).group(1)),
                         spills=sum(map(int, re.findall(r"(\d+) bytes spill (?:stores|loads)", rec.ptxas))),
                         stack=int(re.search(r"(\d+) bytes stack frame", rec.ptxas).group(1)),
                         smem=K.smem_bytes(cfg.fp8, cfg.k, cfg.bm, cfg.bn, cfg.stages, cfg.epi, cfg.ksplit, cfg.swap,
                                           cfg.tstore)))
    fam = collections.defaultdict(list)
    for r in rows:
        c = r["cfg"]
        name = "K split" if c["ksplit"] else f"BM {c['bm']}" + (" pipelined" if c["pipe"] else "")
        name += (" BN 256 RS" if c.get("rs") else " BN 256") if c["bn"] > 128 else ""
        name += " TMA store" if c.get("tstore") else ""
        name += f" multicast {c['mcast']}" if c["mcast"] else ""
        fam[f"swap-AB {c['swap']}" if c["swap"] else name].append(r)
    print(f"{len(rows)} kernels (nvcc, sm_90a)")
    print("| family | threads | kernels | registers | kernels that spill | spill bytes | stack bytes | max smem | odd stages "
          "| WGMMA serialised (C75xx) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, v in sorted(fam.items()):
        regs = sorted({r["regs"] for r in v})
        print(f"| {name} | {v[0]['threads']} | {len(v)} | {regs[0]}-{regs[-1]} "
              f"| {sum(bool(r['spills'] or r['stack']) for r in v)} | {sum(r['spills'] for r in v)} "
              f"| {sum(r['stack'] for r in v)} | {max(r['smem'] for r in v)} | {sum(r['cfg']['stages'] % 2 for r in v)} "
              f"| {sum(r['serialised'] for r in v)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)
    # a pipelined, multicast or RS kernel that spills is not used (the JIT falls back to the plain one): no failure
    bad = [r for r in rows if ((r["spills"] or r["stack"]) and not r["cfg"]["pipe"] and not r["cfg"]["mcast"]
                               and not r["cfg"].get("rs"))
           or (r["cfg"]["ksplit"] and r["cfg"]["stages"] % 2)
           or ((r["cfg"]["swap"] == 2 or r["cfg"]["pipe"]) and r["serialised"])]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
