"""Randomised model check of the BF16 wgmma kernel's seesaw consumers (FLASHMLA_WGMMA_SEESAW=1,
run_consumers_seesaw in ../wgmma_common.cuh; update together).

Both consumer warpgroups own half of O (256 columns each) and take the pages of a request in turns:
page j is owned by warpgroup j & 1, which runs its S, the softmax and publishes P_j (bf16 hi plane
in the page's RoPE slab, the lo plane in the one P_lo buffer for hi/lo requests) and the running
row max m_j (one buffer: its next writer is the warpgroup that reads it) behind named barrier
PF[j & 1]; the other warpgroup syncs there and applies P_j to its half. One own step j of a warpgroup:
  1. waits full[j - 1] (j >= 1: before any wgmma is in flight) and full[j], issues S_j;
  2. (j >= 1) syncs PF[(j - 1) & 1], reads m_{j-1}, issues P V of page j - 1 (the other's page);
  3. wait_group 1: S_j done (the P V of j - 1 still runs); the last own S of the request arrives
     on q_empty (256: both warpgroups; one that owns no page arrives at the request's start);
  4. writes P_j, m_j and arrives on PF[j & 1];
  5. wait_group 0: P V of j - 1 done, its stage released; issues its P V of page j;
  6. wait_group 0: its P V of page j done, its stage released (hi/lo: PE arrival).
  hi/lo pages (one P_lo buffer): 5's wait and release come before 4, and 4 first syncs PE (the
  other warpgroup is done with P_lo of j - 1).
After its last own page a warpgroup still applies the other's last page when that comes later.
Epilogue: each warpgroup writes its partial row sums, both sync (EPI0), read the other's and sync
again (EPI1) before either can write the next request's.
Checks (sim.py): no deadlock, every read sees its version (Q, K stages, P planes, m, l), no double
arrival on a named barrier. `--mutants` breaks one order or buffer at a time. ~5 s:

    python flashmla/csrc/models/seesaw_protocol_model.py [--trials N] [--mutants]
"""
import random, sys

from sim import MBar, NBar, bf16_producer, expect_caught, random_mixes, simulate


def run(reqs, seed, mut=None):
    rnd = random.Random(seed)
    mb = {**{f"full{i}": MBar(1) for i in range(2)}, **{f"empty{i}": MBar(2) for i in range(2)},
          "qfull": MBar(1), "qempty": MBar(1 if mut == "qempty_one_wg" else 2)}
    nb = {k: NBar(k) for k in ("PF0", "PF1", "PE", "EPI0", "EPI1")}

    def wg(w):
        it = qn = 0
        inflight = []  # buffers read by the committed wgmma groups, oldest first

        def issue(bufs):
            for b, v in bufs: yield ("rbeg", b, v)
            inflight.append(bufs)

        def wait_group(n):
            while len(inflight) > n:
                for b, v in inflight.pop(0): yield ("rend", b, v)

        for r, (npg, lo) in enumerate(reqs):
            if npg == 0: continue
            yield ("wait", "qfull", qn & 1); qn += 1
            own = [j for j in range(npg) if j & 1 == w]
            if not own and mut != "qempty_one_wg": yield ("arrive", "qempty")
            st = lambda j: (it + j) & 1
            pv = lambda j: [(f"K{st(j)}", ("K", it + j)), (f"H{st(j)}", ("P", it + j))] + (
                [("Plo", ("P", it + j))] if lo else [])

            def release(j):  # this warpgroup's P V of page j is complete
                yield ("arrive", f"empty{st(j)}")
                if lo and j + 1 < npg and (j & 1) == w and mut != "no_pe": yield ("narrive", "PE")

            def apply_other(j):  # P V of the other warpgroup's page j (full[j] waited by the caller)
                yield ("nsync", f"PF{j & 1}")
                yield ("rbeg", "M", ("M", it + j)); yield ("rend", "M", ("M", it + j))
                yield from issue(pv(j))

            for j in own:
                if j >= 1: yield ("wait", f"full{st(j - 1)}", ((it + j - 1) >> 1) & 1)
                yield ("wait", f"full{st(j)}", ((it + j) >> 1) & 1)
                yield from issue([("Q", ("Q", r)), (f"K{st(j)}", ("K", it + j)), (f"H{st(j)}", ("K", it + j))])
                if mut == "p_before_s_done": yield ("write", f"H{st(j)}", ("P", it + j))
                if j >= 1: yield from apply_other(j - 1)
                yield from wait_group(1 if j >= 1 else 0)
                if j == own[-1] and (mut != "qempty_one_wg" or j == npg - 1): yield ("arrive", "qempty")
                def pv_prev_done():
                    if j >= 1:
                        if mut == "release_before_pv_done": yield from release(j - 1); yield from wait_group(0)
                        else: yield from wait_group(0); yield from release(j - 1)
                early = lo and mut != "lo_release_late"  # one P_lo buffer: the own P V of j - 1 first
                if early: yield from pv_prev_done()
                if lo and j >= 1 and mut != "no_pe": yield ("nsync", "PE")
                yield ("write", f"H{st(j)}", ("P", it + j))
                if lo: yield ("write", "Plo", ("P", it + j))
                yield ("write", "M", ("M", it + j))
                yield ("narrive", f"PF{j & 1}")
                if not early: yield from pv_prev_done()
                yield from issue(pv(j))
                if mut == "own_release_early": yield from release(j); yield from wait_group(0)
                else: yield from wait_group(0); yield from release(j)
            last = npg - 1
            if last & 1 != w:  # the other warpgroup's last page comes after this one's last own page
                yield ("wait", f"full{st(last)}", ((it + last) >> 1) & 1)
                yield from apply_other(last)
                yield from wait_group(0); yield from release(last)
            # partial row sums: one buffer per warpgroup, read between two syncs
            yield ("write", f"L.{w}", ("L", r)); yield ("nsync", "EPI0")
            yield ("rbeg", f"L.{1 - w}", ("L", r)); yield ("rend", f"L.{1 - w}", ("L", r))
            if mut != "l_one_sync": yield ("nsync", "EPI1")
            it += npg

    simulate({"P": bf16_producer(reqs), "W0": wg(0), "W1": wg(1)}, mb, nb, rnd, max_steps=100000)


def numeric_check(trials=200):
    """The seesaw's arithmetic in float64 against a plain softmax: the owner of page j takes m_j =
    max(m_{j-1}, rowmax S_j) and adds its P row sums to its own partial l; every warpgroup rescales
    its half of O and its l by alpha_j = 2^(m_{j-1} - m_j) (0 for a row with no visible key yet);
    at the end l = l_0 + l_1, O / l and lse = (m + log2 l) ln 2. Rows fully masked come out 0 / +inf."""
    import numpy as np
    rng = np.random.default_rng(0)
    for _ in range(trials):
        npg, rows = int(rng.integers(1, 7)), 4
        s = rng.standard_normal((npg, rows, 8)) * 4
        s[rng.random(s.shape) < 0.3] = -np.inf           # masked keys (whole pages and rows too)
        v = rng.standard_normal((npg, 8, 6))
        m = np.full(rows, -np.inf); o = np.zeros((2, rows, 3)); l = np.zeros((2, rows))
        for j in range(npg):
            mn = np.maximum(m, s[j].max(1))
            muse = np.where(mn == -np.inf, 0.0, mn)
            al = np.exp2(m - muse)
            p = np.exp2(s[j] - muse[:, None])
            for w in range(2):
                o[w] *= al[:, None]; l[w] *= al
                o[w] += p @ v[j][:, 3 * w:3 * w + 3]
            l[j & 1] += p.sum(1)
            m = mn
        lt = l[0] + l[1]
        out = np.concatenate(o, 1) / np.where(lt > 0, lt, 1)[:, None]
        full = s.transpose(1, 0, 2).reshape(rows, -1)
        vv = v.reshape(-1, 6)
        for r in range(rows):
            if np.isinf(full[r]).all():
                assert lt[r] == 0 and not out[r].any()
                continue
            e = np.exp2(full[r] - full[r].max())
            assert np.allclose(out[r], e @ vv / e.sum()), "O differs from the softmax"
            lse = (m[r] + np.log2(lt[r])) * np.log(2)
            assert np.isclose(lse, np.log(np.exp2(full[r]).sum())), "lse differs"


def check(trials, mut=None):
    return random_mixes(run, trials, mut, [0, 1, 1, 2, 3, 4, 5], 6)


MUTANTS = ("p_before_s_done", "no_pe", "release_before_pv_done", "qempty_one_wg", "l_one_sync",
           "lo_release_late", "own_release_early")

if __name__ == "__main__":
    trials = int(sys.argv[sys.argv.index("--trials") + 1]) if "--trials" in sys.argv else 2000
    n = check(trials)
    numeric_check()
    print("seesaw ok:", n, "random schedules (bf16 and hi/lo P), no deadlock, no race; arithmetic == softmax")
    if "--mutants" in sys.argv:
        expect_caught(lambda mut: check(trials, mut), MUTANTS)
        print("all", len(MUTANTS), "mutants caught")
