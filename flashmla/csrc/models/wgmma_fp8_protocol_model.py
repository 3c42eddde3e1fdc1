"""Randomised model check of the FP8 wgmma kernel's synchronisation (../mla_decode_wgmma_fp8.cu).

Like wgmma_protocol_model.py (same consumers), but the producer warpgroup is split the way the
FP8 kernel runs it: thread 0 (Q TMA after qempty; per page: wait empty[s], expect_tx + the TMA of box 1's
raw NoPE bytes into the stage's slabs 6-7 on raw_full[s], expect_tx + RoPE TMA into slab 8 on full[s],
then its own share of the dequantisation) and the other 127 dequantising threads, modelled as two groups
of 64 and 63 arrivals. Each share: wait empty[s], store its box-0 values (slabs 0-3, its own; their raw
bytes came from global memory into registers before the wait), wait raw_full[s], read box 1's raw bytes,
sync the producer warpgroup (named barrier), store its box-1 values over the raw bytes (slabs 4-7: the
raw TMA lands under every share's box-1 stores), arrive on full[s]. full[s] needs 129
arrivals plus the RoPE bytes; empty[s] 256 (both consumer warpgroups). Checks, over random request
mixes and interleavings: no deadlock, every read sees the version it expects from start to end (the
raw bytes, each box-0 share, the slabs 4-7, the RoPE/P_hi slab, P_lo, Q, the row scales and 1/l), no
double arrival at a named barrier, no store into a buffer a copy is landing in. `--mutants` breaks
one count, wait or order at a time and asserts the model catches each. With f16 consumers
(FLASHMLA_FP8_F16=1, `f16`): after Q lands every share reads its part of Q and stores its maximum (sQred),
the producer warpgroup syncs, every share reads all maxima and converts its part of Q in place, thread 0
stores 2^E (sQmul), and each share arrives on q_ready (128 arrivals), which WG1 waits for instead of q_full
before it reads Q and 2^E. Update together with the kernel. ~6 s:

    python flashmla/csrc/models/wgmma_fp8_protocol_model.py [--trials N] [--mutants]
"""
import random, sys

from sim import MBar, NBar, expect_caught, random_mixes, simulate

SHARES = (("T0", 1), ("D1", 64), ("D2", 63))  # dequantising threads and their mbarrier arrivals


def run(reqs, seed, mut=None, f16=False):
    rnd = random.Random(seed)
    full_count = 128 if mut == "full_count_128" else 129
    empty_count = 128 if mut == "empty_count_128" else 256
    mb = {**{f"full{i}": MBar(full_count) for i in range(2)}, **{f"empty{i}": MBar(empty_count) for i in range(2)},
          **{f"raw{i}": MBar(1) for i in range(2)}, "qfull": MBar(1), "qempty": MBar(128),
          "qready": MBar(127 if mut == "qready_count_127" else 128), "pempty": MBar(128)}
    qparts = [f"Q.{n}" for n, _ in SHARES] if f16 else ["Q"]  # f16: each share converts its part of Q
    nb = {k: NBar(k) for k in ("PFULL0", "PFULL1", "EPI0", "EPI1")}
    nb["PROD"] = NBar("PROD", parties=len(SHARES))

    def dequant(name, weight, s, it):  # one share's part of page it in stage s (after its empty wait)
        yield ("write", f"Lo{s}.{name}", ("K", it))  # box 0, loaded from global memory into registers
        if mut != "dequant_skips_raw_wait":
            yield ("wait", f"raw{s}", (it >> 1) & 1)
        for n, _ in SHARES:  # its box-1 raw chunks lie anywhere in slabs 6-7, under every share's box-1 stores
            yield ("rbeg", f"Hi{s}.{n}", ("raw", it)); yield ("rend", f"Hi{s}.{n}", ("raw", it))
        if mut != "no_producer_barrier":
            yield ("nsync", "PROD")
        if mut == "arrive_before_store" and name == "D1":
            yield ("arrive", f"full{s}", weight); yield ("write", f"Hi{s}.{name}", ("K", it))
        else:
            yield ("write", f"Hi{s}.{name}", ("K", it)); yield ("arrive", f"full{s}", weight)

    def convert_q(name, weight, r, qn):  # f16 consumers: this share's part of convert_q for request r
        yield ("wait", "qfull", qn & 1)
        yield ("rbeg", f"Q.{name}", ("Q", r)); yield ("rend", f"Q.{name}", ("Q", r))
        yield ("write", f"Red.{name}", ("R", r))
        if mut != "no_reduction_barrier":
            yield ("nsync", "PROD")
        for n, _ in SHARES:
            yield ("rbeg", f"Red.{n}", ("R", r)); yield ("rend", f"Red.{n}", ("R", r))
        yield ("write", f"Q.{name}", ("Qc", r))
        if name == "T0": yield ("write", "Mul", ("M", r))
        yield ("arrive", "qready", weight)

    def t0():  # producer thread 0: TMA of Q, the raw NoPE and the RoPE, and its share of the dequantisation
        it = qn = 0
        for r, (npg, _) in enumerate(reqs):
            if npg == 0: continue
            yield ("wait", "qempty", (qn & 1) ^ 1)
            yield ("expect", "qfull", len(qparts))
            for b in qparts: yield ("tma", b, ("Q", r), "qfull")
            if f16: yield from convert_q("T0", 1, r, qn)
            qn += 1
            for _ in range(npg):
                s = it & 1
                raw = [("expect", f"raw{s}", len(SHARES))] + [("tma", f"Hi{s}.{n}", ("raw", it), f"raw{s}") for n, _ in SHARES]
                if mut == "raw_before_wait": yield from raw
                yield ("wait", f"empty{s}", ((it >> 1) & 1) ^ 1)
                if mut != "raw_before_wait": yield from raw
                yield ("expect", f"full{s}", 1); yield ("tma", f"H{s}", ("K", it), f"full{s}")
                yield from dequant("T0", 1, s, it)
                it += 1

    def dq(name, weight):  # dequantising threads (one group of `weight` threads)
        it = qn = 0
        for r, (npg, _) in enumerate(reqs):
            if f16 and npg:
                yield from convert_q(name, weight, r, qn); qn += 1
            for _ in range(npg):
                s = it & 1
                yield ("wait", f"empty{s}", ((it >> 1) & 1) ^ 1)
                yield from dequant(name, weight, s, it)
                it += 1

    def page_reads(s, it, what, lo=True):
        out = [(f"{half}{s}.{n}", ("K", it)) for half in ("Lo", "Hi") for n, _ in SHARES]
        if what == "S": out.append((f"H{s}", ("K", it)))
        else: out += [(f"H{s}", ("P", it))] + ([("Plo", ("P", it))] if lo else [])
        return out

    def wg1():  # the shared consumers (wgmma_common.cuh, plain order: the FP8 kernel runs PIPE=false)
        it = qn = rq = lo_pages = 0
        for r, (npg, lo) in enumerate(reqs):
            qv = ("Qc", r) if f16 else ("Q", r)
            if npg:
                yield ("wait", "qready" if f16 and mut != "wg1_waits_qfull" else "qfull", qn & 1); qn += 1
                if f16: yield ("rbeg", "Mul", ("M", r)); yield ("rend", "Mul", ("M", r))
            for j in range(npg):
                s = it & 1
                yield ("wait", f"full{s}", (it >> 1) & 1)
                rd = [(b, qv) for b in qparts] + page_reads(s, it, "S")
                for b, v in rd: yield ("rbeg", b, v)
                for b, v in rd: yield ("rend", b, v)
                if j == npg - 1: yield ("arrive", "qempty", 128)
                if lo and lo_pages > 0: yield ("wait", "pempty", (lo_pages - 1) & 1)
                lo_pages += lo
                if lo: yield ("write", "Plo", ("P", it))
                yield ("write", f"H{s}", ("P", it)); yield ("write", f"A{s}", ("A", it))
                yield ("narrive", f"PFULL{s}")
                for b, v in page_reads(s, it, "PV", lo): yield ("rbeg", b, v)
                for b, v in page_reads(s, it, "PV", lo): yield ("rend", b, v)
                yield ("arrive", f"empty{s}", 128); it += 1
            if npg:
                yield ("write", f"I{rq & 1}", ("I", r)); yield ("narrive", f"EPI{rq & 1}")
            rq += npg > 0

    def wg2():
        it = rq = 0
        for r, (npg, lo) in enumerate(reqs):
            for j in range(npg):
                s = it & 1
                yield ("wait", f"full{s}", (it >> 1) & 1)
                yield ("nsync", f"PFULL{s}")
                yield ("rbeg", f"A{s}", ("A", it)); yield ("rend", f"A{s}", ("A", it))
                for b, v in page_reads(s, it, "PV", lo): yield ("rbeg", b, v)
                for b, v in page_reads(s, it, "PV", lo): yield ("rend", b, v)
                if lo: yield ("arrive", "pempty", 128)
                if j < npg - 1: yield ("arrive", f"empty{s}", 128)
                it += 1
            if npg:  # 1/l first, then the last page's stage is released
                yield ("nsync", f"EPI{rq & 1}"); yield ("rbeg", f"I{rq & 1}", ("I", r)); yield ("rend", f"I{rq & 1}", ("I", r))
                yield ("arrive", f"empty{(it - 1) & 1}", 128)
            rq += npg > 0

    simulate({"T0": t0(), "W1": wg1(), "W2": wg2(), **{n: dq(n, w) for n, w in SHARES[1:]}}, mb, nb, rnd)


def check(trials, mut=None, f16=False):
    return random_mixes(lambda reqs, seed, m: run(reqs, seed, m, f16), trials, mut, [0, 0, 1, 1, 2, 3, 5], 5)


MUTANTS = ("full_count_128", "empty_count_128", "raw_before_wait", "dequant_skips_raw_wait", "no_producer_barrier",
           "arrive_before_store")
F16_MUTANTS = ("qready_count_127", "wg1_waits_qfull", "no_reduction_barrier")

if __name__ == "__main__":
    trials = int(sys.argv[sys.argv.index("--trials") + 1]) if "--trials" in sys.argv else 2000
    n = check(trials) + check(trials, f16=True)
    print("fp8 protocol model ok:", n, "random schedules (bf16 and f16 consumers), no deadlock, no race")
    if "--mutants" in sys.argv:
        expect_caught(lambda mut: check(trials, mut), MUTANTS)
        expect_caught(lambda mut: check(trials, mut, f16=True), F16_MUTANTS)
        print("all", len(MUTANTS) + len(F16_MUTANTS), "mutants caught")
