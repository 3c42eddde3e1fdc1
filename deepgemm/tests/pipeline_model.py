"""An executable model of the SM90 kernel's TMA/mbarrier pipeline (sm90_gemm.cuh), for CPU tests.

It replays the producer / consumer protocol of one CTA under random interleavings and random
(out-of-order) TMA completion times, with the PTX semantics of `mbarrier.try_wait.parity` (a wait for
parity p passes while the barrier's current, incomplete phase has the other parity), and reports
protocol violations:
  - "early read": a consumer passed the full-barrier wait of fill i while stage i % STAGES did not yet
    hold fill i's bytes (it would read stale or half-written shared memory);
  - "over-arrival": an arrive on a barrier phase that has no pending arrivals left (undefined in PTX);
  - "exit with TMA in flight": every thread finished while a bulk copy was still writing shared memory.

Modelled: one producer thread filling stages in order; KSPLIT = 1: two consumer warpgroups taking
alternate K blocks of each tile (kb % 2), each warpgroup's release counted as one arrival on a
barrier initialised with count 1 (the kernel: 4 warps, count 4), and the named barrier 3 that
both warpgroups pass at the end of every tile; KSPLIT = 0: one warpgroup takes every K block; PIPE:
a warpgroup's K blocks in pairs (both stages waited for, then both released).
"""
from __future__ import annotations

import random


class MBarrier:
    def __init__(self, count: int):
        self.count, self.pending, self.tx, self.completed = count, count, 0, 0

    def passes(self, parity: int) -> bool:  # mbarrier.try_wait.parity
        return (self.completed & 1) != parity

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.count

    def arrive(self, tx: int = 0) -> bool:
        """Returns False on an over-arrival (no arrival pending in the current phase)."""
        ok = self.pending > 0
        self.pending -= 1
        self.tx += tx
        self._maybe_complete()
        return ok

    def complete_tx(self, tx: int):
        self.tx -= tx
        self._maybe_complete()


def simulate(stages: int, kb: int, tiles: int, ksplit: int, seed: int, in_order_tma: bool = False,
             pipe: int = 0) -> list[str]:
    """One random run of one CTA that computes `tiles` tiles of `kb` K blocks. Returns violations.
    pipe = 1: each warpgroup takes its K blocks in pairs, waiting for both stages before it releases
    either (an odd last block alone)."""
    rng = random.Random(seed)
    nwg = 2 if ksplit else 1
    full = [MBarrier(1) for _ in range(stages)]
    empty = [MBarrier(1) for _ in range(stages)]
    landed = [-1] * stages  # which fill's bytes stage s holds
    in_flight: list[int] = []  # fills whose TMA has not completed, in issue order
    total = tiles * kb
    prod = 0  # next fill the producer issues
    # each consumer's program: ("acq", i) waits for fill i and reads it, ("rel", i) frees its stage, for its K
    # blocks; ("bar3", tile) at the end of each tile
    progs = []
    for w in range(nwg):
        p = []
        for t in range(tiles):
            mine = [t * kb + k for k in range(w, kb, nwg)]
            step = 2 if pipe else 1
            for j in range(0, len(mine), step):
                group = mine[j:j + step]
                p += [("acq", i) for i in group] + [("rel", i) for i in group]
            if ksplit:
                p.append(("bar3", t))
        progs.append(p)
    pc = [0] * nwg
    bar3 = [0] * tiles  # arrivals at named barrier 3, per tile
    arrived = [False] * nwg
    viol: list[str] = []
    while True:
        actions = []
        if prod < total and empty[prod % stages].passes(((prod // stages) & 1) ^ 1):
            actions.append("produce")
        if in_flight:
            actions.append("land")
        for w in range(nwg):
            if pc[w] >= len(progs[w]):
                continue
            op, i = progs[w][pc[w]]
            if op == "rel" or (op == "acq" and full[i % stages].passes((i // stages) & 1)):
                actions.append(w)
            if op == "bar3" and (not arrived[w] or bar3[i] == nwg):
                actions.append(w)
        if not actions:
            break
        a = rng.choice(actions)
        if a == "produce":
            s = prod % stages
            if not full[s].arrive(tx=1):
                viol.append(f"over-arrival on full[{s}] by fill {prod}")
            in_flight.append(prod)
            prod += 1
        elif a == "land":
            j = in_flight.pop(0 if in_order_tma else rng.randrange(len(in_flight)))
            landed[j % stages] = j
            full[j % stages].complete_tx(1)
        else:
            w = a
            op, i = progs[w][pc[w]]
            if op == "acq":
                s = i % stages
                if landed[s] != i:
                    viol.append(f"early read: warpgroup {w} read fill {i} from stage {s} holding fill {landed[s]}")
                pc[w] += 1
            elif op == "rel":
                if not empty[i % stages].arrive():
                    viol.append(f"over-arrival on empty[{i % stages}] by warpgroup {w} (fill {i})")
                pc[w] += 1
            elif not arrived[w]:  # bar.sync 3: arrive, then pass once every warpgroup has arrived
                arrived[w] = True
                bar3[i] += 1
            else:
                arrived[w] = False
                pc[w] += 1
    if any(pc[w] < len(progs[w]) for w in range(nwg)) or prod < total:
        viol.append(f"deadlock: producer at {prod}/{total}, consumers at {pc}")
    if in_flight:
        viol.append(f"exit with TMA in flight: fills {in_flight}")
    return viol


def find_violation(stages: int, kb: int, tiles: int, ksplit: int, runs: int = 200,
                   in_order_tma: bool = False, pipe: int = 0) -> list[str]:
    """Violations of the first of `runs` random runs that has any (empty list: none found)."""
    for seed in range(runs):
        v = simulate(stages, kb, tiles, ksplit, seed, in_order_tma, pipe)
        if v:
            return v
    return []


def simulate_mcast(stages: int, kb: int, tiles: int, nwg: int, seed: int, in_order_tma: bool = False,
                   remote_release: bool = True, ksplit: bool = False) -> list[str]:
    """MCAST = 1: a cluster of two CTAs computing `tiles` tile pairs of `kb` K blocks. Each CTA's
    producer waits on its own empty barrier, arms its own full barrier for its A part and both halves of
    B, loads its A and multicasts its half of B into both CTAs. Each of the `nwg` consumer warpgroups of
    a CTA reads every fill and releases it on its own empty barrier and (remote_release) on the peer's;
    the empty barriers count 2·nwg arrivals (nwg without remote_release, the broken variant). A read
    checks that the stage holds this fill's A and both B halves ("early read" otherwise, which also
    catches a peer's multicast overwriting a stage still in use). Both CTAs leave through a cluster
    barrier, so the run ends when every thread of both is done. ksplit: the two warpgroups of a CTA take
    alternate K blocks (kb % 2) instead of every fill; each fill is then released by one warpgroup per CTA."""
    rng = random.Random(seed)
    readers = 1 if ksplit else nwg  # warpgroups of one CTA that read (and release) each fill
    count = 2 * readers if remote_release else readers
    full = [[MBarrier(1) for _ in range(stages)] for _ in range(2)]
    empty = [[MBarrier(count) for _ in range(stages)] for _ in range(2)]
    landed = [[[-1, -1, -1] for _ in range(stages)] for _ in range(2)]  # [cta][stage][A, B half 0, B half 1]
    in_flight: list[tuple[int, int, int]] = []  # (destination cta, part, fill)
    total = tiles * kb
    prod = [0, 0]
    # each warpgroup's program: its fills in order (K split: its K blocks of every tile, then the named
    # barrier 3 that both warpgroups of the CTA pass at the end of every tile, as in simulate())
    progs = []
    for w in range(nwg):
        p = []
        for t in range(tiles):
            p += [("fill", t * kb + k) for k in range(kb) if not ksplit or k % nwg == w]
            if ksplit:
                p.append(("bar3", t))
        progs.append(p)
    pc = [[0] * nwg for _ in range(2)]
    bar3 = [[0] * tiles for _ in range(2)]
    arrived = [[False] * nwg for _ in range(2)]
    viol: list[str] = []
    while True:
        actions = []
        for c in range(2):
            i = prod[c]
            if i < total and empty[c][i % stages].passes(((i // stages) & 1) ^ 1):
                actions.append(("produce", c, 0))
            for w in range(nwg):
                if pc[c][w] < len(progs[w]):
                    op, i = progs[w][pc[c][w]]
                    if op == "fill" and full[c][i % stages].passes((i // stages) & 1):
                        actions.append(("consume", c, w))
                    if op == "bar3" and (not arrived[c][w] or bar3[c][i] == nwg):
                        actions.append(("consume", c, w))
        if in_flight:
            actions.append(("land", 0, 0))
        if not actions:
            break
        kind, c, w = rng.choice(actions)
        if kind == "produce":
            i = prod[c]
            if not full[c][i % stages].arrive(tx=3):
                viol.append(f"over-arrival on full[{c}][{i % stages}] by fill {i}")
            in_flight += [(c, 0, i), (0, 1 + c, i), (1, 1 + c, i)]  # own A; B half c into both CTAs
            prod[c] += 1
        elif kind == "land":
            dst, part, i = in_flight.pop(0 if in_order_tma else rng.randrange(len(in_flight)))
            landed[dst][i % stages][part] = i
            full[dst][i % stages].complete_tx(1)
        elif progs[w][pc[c][w]][0] == "bar3":  # bar.sync 3: arrive, then pass once both have arrived
            t_ = progs[w][pc[c][w]][1]
            if not arrived[c][w]:
                arrived[c][w] = True
                bar3[c][t_] += 1
            else:
                arrived[c][w] = False
                pc[c][w] += 1
        else:
            i = progs[w][pc[c][w]][1]
            s = i % stages
            if landed[c][s] != [i, i, i]:
                viol.append(f"early read: cta {c} warpgroup {w} read fill {i} from stage {s} holding {landed[c][s]}")
            if not empty[c][s].arrive():
                viol.append(f"over-arrival on empty[{c}][{s}] (fill {i})")
            if remote_release and not empty[1 - c][s].arrive():
                viol.append(f"over-arrival on empty[{1 - c}][{s}] from cta {c} (fill {i})")
            pc[c][w] += 1
    if prod != [total, total] or any(pc[c][w] < len(progs[w]) for c in range(2) for w in range(nwg)):
        viol.append(f"deadlock: producers at {prod}/{total}, consumers at {pc}")
    if in_flight:
        viol.append(f"exit with TMA in flight: {in_flight}")
    return viol
