"""Randomised model check of the wgmma kernel's synchronisation (producer, WG1, WG2, TMA engine).

Mirrors the control flow of ../mla_decode_wgmma.cu and its consumers in ../wgmma_common.cuh (update together): mbarriers with phase
parity and transaction counts, named barriers over the two consumer warpgroups (each warpgroup is
one actor), TMA copies that land at random later times. Over random request mixes (0-5 pages each)
and random interleavings it checks: no deadlock, every read sees the version it expects from its
start to its end (read-after-write and write-after-read races on the Q tile, the K stages, the P
planes, the row scales and 1/l), and no named barrier gets a second arrival from the same side.
A model, not the kernel: it proves the protocol, not the PTX. ~5 s:

    python flashmla/csrc/models/wgmma_protocol_model.py
"""
import random, sys

class MBar:
    def __init__(s, count): s.count, s.arr, s.tx, s.done = count, 0, 0, 0
    def maybe(s):
        if s.arr == s.count and s.tx == 0: s.arr = 0; s.done += 1
    def ready(s, parity): return (s.done & 1) != parity

class NBar:  # named barrier over 2 actors (each = one warpgroup of 128 threads)
    def __init__(s): s.arrived, s.gen = set(), 0
    def arrive(s, who):
        assert who not in s.arrived, f"double arrival by {who}"
        s.arrived.add(who)
        if len(s.arrived) == 2: s.arrived.clear(); s.gen += 1

def run(reqs, seed):
    rnd = random.Random(seed)
    mb = {**{f"full{i}": MBar(1) for i in range(2)}, **{f"empty{i}": MBar(2) for i in range(2)},
          "qfull": MBar(1), "qempty": MBar(1)}
    nb = {k: NBar() for k in ("PFULL", "PEMPTY", "EPI")}
    buf = {}
    dma = []
    def producer():
        it = qn = 0
        for r, npg in enumerate(reqs):
            if npg == 0: continue
            yield ("wait", "qempty", (qn & 1) ^ 1)
            yield ("expect", "qfull"); yield ("tma", "Q", ("Q", r), "qfull"); qn += 1
            for _ in range(npg):
                s = it & 1
                yield ("wait", f"empty{s}", ((it >> 1) & 1) ^ 1)
                yield ("expect", f"full{s}")
                yield ("tma", f"K{s}", ("K", it), f"full{s}"); yield ("tma", f"H{s}", ("K", it), f"full{s}")
                it += 1
    def wg1():
        it = qn = rq = 0
        for r, npg in enumerate(reqs):
            if npg: yield ("wait", "qfull", qn & 1); qn += 1
            for j in range(npg):
                s = it & 1
                yield ("wait", f"full{s}", (it >> 1) & 1)
                yield ("rbeg", "Q", ("Q", r)); yield ("rbeg", f"K{s}", ("K", it)); yield ("rbeg", f"H{s}", ("K", it))
                yield ("rend", "Q", ("Q", r)); yield ("rend", f"K{s}", ("K", it)); yield ("rend", f"H{s}", ("K", it))
                if j == npg - 1: yield ("arrive", "qempty")
                if it > 0: yield ("nsync", "PEMPTY")
                yield ("write", "Plo", ("P", it)); yield ("write", f"H{s}", ("P", it)); yield ("write", "A", ("A", it))
                yield ("nsync", "PFULL")
                for b, v in ((f"K{s}", ("K", it)), (f"H{s}", ("P", it)), ("Plo", ("P", it))): yield ("rbeg", b, v)
                for b, v in ((f"K{s}", ("K", it)), (f"H{s}", ("P", it)), ("Plo", ("P", it))): yield ("rend", b, v)
                yield ("arrive", f"empty{s}"); it += 1
            if npg:
                yield ("write", f"I{rq & 1}", ("I", r)); yield ("narrive", "EPI")
            rq += npg > 0
        if it > 0: yield ("nsync", "PEMPTY")
    def wg2():
        it = rq = 0
        for r, npg in enumerate(reqs):
            for j in range(npg):
                s = it & 1
                yield ("wait", f"full{s}", (it >> 1) & 1)
                yield ("nsync", "PFULL")
                yield ("rbeg", "A", ("A", it)); yield ("rend", "A", ("A", it))
                for b, v in ((f"K{s}", ("K", it)), (f"H{s}", ("P", it)), ("Plo", ("P", it))): yield ("rbeg", b, v)
                for b, v in ((f"K{s}", ("K", it)), (f"H{s}", ("P", it)), ("Plo", ("P", it))): yield ("rend", b, v)
                yield ("narrive", "PEMPTY")
                yield ("arrive", f"empty{s}"); it += 1
            if npg:
                yield ("nsync", "EPI"); yield ("rbeg", f"I{rq & 1}", ("I", r)); yield ("rend", f"I{rq & 1}", ("I", r))
            rq += npg > 0
    actors = {"P": producer(), "W1": wg1(), "W2": wg2()}
    pending = {k: next(g, None) for k, g in actors.items()}
    waiting_n = {}  # actor -> (barrier, generation) while blocked in nsync
    steps = 0
    while True:
        steps += 1
        assert steps < 100000
        runnable = []
        for a, op in pending.items():
            if op is None: continue
            if op[0] == "wait" and not mb[op[1]].ready(op[2]): continue
            if op[0] == "nsync" and a in waiting_n:
                b, g = waiting_n[a]
                if nb[b].gen == g: continue
            runnable.append(a)
        choices = runnable + (["DMA"] if dma else [])
        if not choices:
            if all(op is None for op in pending.values()): return
            raise AssertionError(f"deadlock: {pending} waiting_n={waiting_n}")
        a = rnd.choice(choices)
        if a == "DMA":
            i = rnd.randrange(len(dma)); b, v, bar = dma.pop(i)
            buf[b] = v; mb[bar].tx -= 1; mb[bar].maybe(); continue
        op = pending[a]
        k = op[0]
        if k == "nsync":
            if a not in waiting_n:
                g = nb[op[1]].gen; nb[op[1]].arrive(a)
                if nb[op[1]].gen == g: waiting_n[a] = (op[1], g); continue
            else: del waiting_n[a]
        elif k == "narrive": nb[op[1]].arrive(a)
        elif k == "expect": m = mb[op[1]]; m.arr += 1; m.tx += 2 if op[1].startswith("full") else 1; m.maybe()
        elif k == "tma": dma.append((op[1], op[2], op[3]))
        elif k == "arrive": m = mb[op[1]]; m.arr += 1; m.maybe()
        elif k == "write": buf[op[1]] = op[2]
        elif k in ("rbeg", "rend"): assert buf.get(op[1]) == op[2], f"{a} {k} {op[1]}: saw {buf.get(op[1])}, expected {op[2]}"
        pending[a] = next(actors[a], None)

n = 0
for trial in range(3000):
    rng = random.Random(trial)
    reqs = [rng.choice([0, 0, 1, 1, 2, 3, 5]) for _ in range(rng.randint(1, 6))]
    for sch in range(5):
        run(reqs, trial * 100 + sch); n += 1
print("ok:", n, "random schedules, no deadlock, no race")
