"""The pieces every CPU protocol model here shares: mbarriers (phase parity, arrival counts,
transaction counts), named barriers, and a random scheduler that runs the kernel's actors
(generators of operations) against them and checks every shared-memory read.

Operations an actor yields:
  ("wait", bar, parity)        block until mbarrier `bar` has completed the phase after `parity`
  ("arrive", bar[, n])         n arrivals (default 1) on mbarrier `bar`
  ("expect", bar[, copies])    one arrival plus `copies` (default 1) copies the barrier must see land
  ("tma", buf, version, bar)   an async copy of `version` into `buf` that lands later, on `bar`
  ("nsync", name) / ("narrive", name)   named barrier: arrive and wait / arrive only
  ("write", buf, version)      a generic-proxy store
  ("rbeg" | "rend", buf, version)  start / end of a read that must see `version` throughout
Checks: no deadlock, every read sees its version, no mbarrier over-arrived in a phase, no second
arrival of one actor at a named barrier, no two copies in flight into one buffer and no store into
a buffer a copy is landing in.
"""
import random


class MBar:
    def __init__(s, count): s.count, s.arr, s.tx, s.done = count, 0, 0, 0
    def arrive(s, n=1):
        s.arr += n
        assert s.arr <= s.count, "mbarrier over-arrived in one phase"
        s.maybe()
    def maybe(s):
        if s.arr == s.count and s.tx == 0: s.arr = 0; s.done += 1
    def ready(s, parity): return (s.done & 1) != parity


class NBar:
    def __init__(s, name, parties=2): s.arrived, s.gen, s.name, s.parties = set(), 0, name, parties
    def arrive(s, who):
        assert who not in s.arrived, f"double arrival by {who} on {s.name}"
        s.arrived.add(who)
        if len(s.arrived) == s.parties: s.arrived.clear(); s.gen += 1


def simulate(actors, mb, nb, rnd, slow=0.02, max_steps=200000):
    """Runs the actors (name -> generator) to completion in a random interleaving; raises
    AssertionError on a race or a deadlock. Each actor (and the copy engine, "DMA") runs at speed 1
    or, with probability 1/3, `slow`: a slow actor lets the others run far ahead, which uniform
    random interleavings almost never do."""
    pending = {k: next(g, None) for k, g in actors.items()}
    speed = {k: rnd.choice([1.0, 1.0, slow]) for k in list(actors) + ["DMA"]}
    buf, dma, waiting_n = {}, [], {}  # waiting_n: actor -> (barrier, generation) while blocked in nsync
    steps = 0
    while True:
        steps += 1
        assert steps < max_steps
        runnable = []
        for a, op in pending.items():
            if op is None: continue
            if op[0] == "wait" and not mb[op[1]].ready(op[2]): continue
            if op[0] == "nsync" and a in waiting_n and nb[waiting_n[a][0]].gen == waiting_n[a][1]: continue
            runnable.append(a)
        choices = runnable + (["DMA"] if dma else [])
        if not choices:
            if all(op is None for op in pending.values()): return
            raise AssertionError(f"deadlock: {pending} waiting_n={waiting_n}")
        a = rnd.choices(choices, [speed.get(c, 1.0) for c in choices])[0]
        if a == "DMA":
            b, v, bar = dma.pop(rnd.randrange(len(dma)))
            buf[b] = v; mb[bar].tx -= 1; mb[bar].maybe(); continue
        op = pending[a]
        k = op[0]
        if k == "nsync":
            if a not in waiting_n:
                g = nb[op[1]].gen; nb[op[1]].arrive(a)
                if nb[op[1]].gen == g: waiting_n[a] = (op[1], g); continue
            else: del waiting_n[a]
        elif k == "narrive": nb[op[1]].arrive(a)
        elif k == "expect": mb[op[1]].tx += op[2] if len(op) > 2 else 1; mb[op[1]].arrive(1)
        elif k == "tma":
            assert all(bb != op[1] for bb, _, _ in dma), f"two copies in flight into {op[1]}"
            dma.append((op[1], op[2], op[3]))
        elif k == "arrive": mb[op[1]].arrive(op[2] if len(op) > 2 else 1)
        elif k == "write":
            assert all(bb != op[1] for bb, _, _ in dma), f"{a} stores into {op[1]} while a copy lands there"
            buf[op[1]] = op[2]
        elif k in ("rbeg", "rend"):
            assert buf.get(op[1]) == op[2], f"{a} {k} {op[1]}: saw {buf.get(op[1])}, expected {op[2]}"
        pending[a] = next(actors[a], None)


def bf16_producer(reqs):
    """The BF16 wgmma kernels' producer (requests of (pages, lo)): Q by TMA after q_empty, then each page's
    K slabs and RoPE slab into stage it & 1 after empty[s], both landing on full[s]."""
    it = qn = 0
    for r, (npg, _) in enumerate(reqs):
        if npg == 0: continue
        yield ("wait", "qempty", (qn & 1) ^ 1)
        yield ("expect", "qfull"); yield ("tma", "Q", ("Q", r), "qfull"); qn += 1
        for _ in range(npg):
            s = it & 1
            yield ("wait", f"empty{s}", ((it >> 1) & 1) ^ 1)
            yield ("expect", f"full{s}", 2)
            yield ("tma", f"K{s}", ("K", it), f"full{s}"); yield ("tma", f"H{s}", ("K", it), f"full{s}")
            it += 1


def expect_caught(fn, muts):
    """fn(mutant) must raise AssertionError for every mutant: the model catches each deliberate break."""
    for mut in muts:
        try:
            fn(mut)
        except AssertionError as e:
            print(f"  mutant {mut}: caught ({str(e)[:70]})")
            continue
        raise SystemExit(f"mutant {mut} NOT caught: the model is too weak")


def random_mixes(run, trials, mut, pages, schedules):
    """run(reqs, seed, mut) over page_mixes(..., flags=True): each request (pages, bf16 or hi/lo P); returns the
    number of runs."""
    n = 0
    for reqs, seed in page_mixes(trials, pages, schedules, flags=True):
        run(reqs, seed, mut); n += 1
    return n


def page_mixes(trials, choices, schedules=4, flags=False):
    """(reqs, seed) for `trials` random mixes of 1-6 requests of random.choice(choices) pages (with flags: each a
    (pages, random bool) pair), `schedules` seeds each."""
    for trial in range(trials):
        rng = random.Random(trial)
        n = rng.randint(1, 6)
        reqs = [(rng.choice(choices), rng.random() < 0.5) if flags else rng.choice(choices) for _ in range(n)]
        for sch in range(schedules):
            yield reqs, trial * 100 + sch
