"""Randomised model check of the wgmma kernel's synchronisation (producer, WG1, WG2, TMA engine).

Mirrors the control flow of ../mla_decode_wgmma.cu and its consumers in ../wgmma_common.cuh (update together): mbarriers with phase
parity and transaction counts, named barriers over the two consumer warpgroups (each warpgroup is
one actor), TMA copies that land at random later times. Over random request mixes (0-5 pages each)
and random interleavings it checks: no deadlock, every read sees the version it expects from its
start to its end (read-after-write and write-after-read races on the Q tile, the K stages, the P
planes, the row scales and 1/l), and no named barrier gets a second arrival from the same side.
Both P precisions (bf16 P: no p_empty; hi/lo P: the p_empty mbarrier guards the one P_lo plane: WG2
arrives after each hi/lo page, WG1 waits for the previous one's arrival, by parity, before it writes P_lo;
a WG2 two arrivals ahead would make that wait hang, which the model reports as a deadlock). A model, not the
kernel: it proves the protocol, not the PTX. `--mutants` breaks one order or buffer at a time and
asserts the model catches each. ~5 s:

    python flashmla/csrc/models/wgmma_protocol_model.py [--trials N] [--mutants]
"""
import random, sys

from sim import MBar, NBar, bf16_producer, expect_caught, random_mixes, simulate


def run(reqs, seed, mut=None):
    rnd = random.Random(seed)
    mb = {**{f"full{i}": MBar(1) for i in range(2)}, **{f"empty{i}": MBar(2) for i in range(2)},
          "qfull": MBar(1), "qempty": MBar(1), "pempty": MBar(1)}
    nb = {k: NBar(k) for k in ("PFULL0", "PFULL1", "EPI0", "EPI1")}
    def wg1():
        it = qn = rq = lo_pages = 0
        def s_reads(it, r):  # S of page it: Q, the K slabs and the RoPE slab H of its stage
            s = it & 1
            for k in ("rbeg", "rend"):
                yield (k, "Q", ("Q", r)); yield (k, f"K{s}", ("K", it)); yield (k, f"H{s}", ("K", it))
        def p_writes(it, lo):  # P_hi into the stage's RoPE slab, P_lo (hi/lo pages), alpha by parity
            yield ("write", f"H{it & 1}", ("P", it))
            if lo: yield ("write", "Plo", ("P", it))
            yield ("write", "A0" if mut == "alpha_one_buffer" else f"A{it & 1}", ("A", it))
        def pv_reads(it, lo):
            s = it & 1
            bufs = [(f"K{s}", ("K", it)), (f"H{s}", ("P", it))] + ([("Plo", ("P", it))] if lo else [])
            for k in ("rbeg", "rend"):
                for b, v in bufs: yield (k, b, v)
        for r, (npg, lo) in enumerate(reqs):
            if npg: yield ("wait", "qfull", qn & 1); qn += 1
            for j in range(npg):
                s = it & 1
                yield ("wait", f"full{s}", (it >> 1) & 1)
                sr = list(s_reads(it, r))
                if mut == "p_before_s_done":  # P_hi into the RoPE slab while S still reads it
                    sr.insert(3, ("write", f"H{s}", ("P", it)))
                yield from sr
                if j == npg - 1: yield ("arrive", "qempty")
                if lo and lo_pages > 0 and mut != "no_p_empty": yield ("wait", "pempty", (lo_pages - 1) & 1)
                lo_pages += lo
                yield from p_writes(it, lo); yield ("narrive", f"PFULL{s}")
                yield from pv_reads(it, lo)
                yield ("arrive", f"empty{s}"); it += 1
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
                bufs = [(f"K{s}", ("K", it)), (f"H{s}", ("P", it))] + ([("Plo", ("P", it))] if lo else [])
                for b, v in bufs: yield ("rbeg", b, v)
                for b, v in bufs: yield ("rend", b, v)
                if lo and mut != "no_p_empty": yield ("arrive", "pempty")
                if j < npg - 1 or mut == "epi_release_early": yield ("arrive", f"empty{s}")
                it += 1
            if npg:  # 1/l first, then the last page's stage is released (keeps WG1 < 2 requests ahead)
                yield ("nsync", f"EPI{rq & 1}"); yield ("rbeg", f"I{rq & 1}", ("I", r)); yield ("rend", f"I{rq & 1}", ("I", r))
                if mut != "epi_release_early": yield ("arrive", f"empty{(it - 1) & 1}")
            rq += npg > 0
    simulate({"P": bf16_producer(reqs), "W1": wg1(), "W2": wg2()}, mb, nb, rnd, max_steps=100000)

def check(trials, mut=None):
    return random_mixes(run, trials, mut, [0, 0, 1, 1, 2, 3, 5], 6)


MUTANTS = ("alpha_one_buffer", "p_before_s_done", "no_p_empty", "epi_release_early")

if __name__ == "__main__":
    trials = int(sys.argv[sys.argv.index("--trials") + 1]) if "--trials" in sys.argv else 2000
    n = check(trials)
    print("ok:", n, "random schedules (bf16 and hi/lo P), no deadlock, no race")
    if "--mutants" in sys.argv:
        expect_caught(lambda mut: check(trials, mut), MUTANTS)
        print("all", len(MUTANTS), "mutants caught")
