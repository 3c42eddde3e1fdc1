"""Native planner + simulator: published bubble formulas, activations, plan consistency, errors."""
import numpy as np
import pytest

from dualpipe import plan, simulate
from dualpipe.schedule import B, COMMIT, F, FB, RECV_B, RECV_F, SEND_B, SEND_F, W, SCHEDULES

RNG = np.random.default_rng(1234)


def _costs(n):
    for _ in range(n):
        F_, B_ = RNG.uniform(0.2, 2.0), RNG.uniform(0.2, 3.0)
        yield F_, B_, RNG.uniform(0.0, B_)


@pytest.mark.parametrize("P", [1, 2, 3, 4, 8, 16])
def test_1f1b_bubble_formula(P):
    # (PP-1)(F+B) on every rank, B = full backward
    for F_, B_, W_ in _costs(4):
        m = P * int(RNG.integers(1, 5))
        r = simulate("1F1B", P, m, F=F_, B=B_, W=W_)
        np.testing.assert_allclose(r.bubble, (P - 1) * (F_ + B_), rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(r.busy, m * (F_ + B_), rtol=1e-12)


@pytest.mark.parametrize("P", [1, 2, 3, 4, 8, 16])
def test_zb1p_bubble_formula(P):
    # (PP-1)(F+B-2W), where it applies: the input-grad part B-W is at least W and F >= W
    # (otherwise a deferred W lengthens the tail; the simulator then reports the real, larger bubble)
    for _ in range(4):
        W_ = RNG.uniform(0.1, 1.0)
        F_, B_ = W_ + RNG.uniform(0, 1), 2 * W_ + RNG.uniform(0, 1)
        m = P * int(RNG.integers(1, 5))
        r = simulate("ZB1P", P, m, F=F_, B=B_, W=W_)
        np.testing.assert_allclose(r.bubble, (P - 1) * (F_ + B_ - 2 * W_), rtol=1e-12, atol=1e-9)
        assert r.bubble.max() <= (P - 1) * (F_ + B_) + 1e-9  # never worse than 1F1B


@pytest.mark.parametrize("P,v", [(2, 2), (4, 2), (4, 3), (8, 2), (8, 4)])
def test_interleaved_bubble_formula(P, v):
    # Megatron: (PP-1)(F+B)/v with per-rank costs = (PP-1)(f+b) with per-stage costs f=F/v, b=B/v
    for f, b, w in _costs(3):
        m = P * int(RNG.integers(1, 4))
        r = simulate("interleaved", P, m, F=f, B=b, W=w, virtual_stages=v)
        np.testing.assert_allclose(r.bubble, (P - 1) * (f + b), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("kind", ["DualPipe", "DualPipeV"])
@pytest.mark.parametrize("P", [2, 4, 6, 8, 16])
def test_dualpipe_bubble_formula(kind, P):
    # (PP/2-1)(F&B+B-3W), PP = stages of one direction (DualPipe: P ranks; DualPipeV: 2P stages).
    # It is exact for the zero-bubble cost model F = W = B/2 and any overlap F&B in [F+W, F+B]
    # (the largest per-rank bubble); we check that regime with random costs.
    half = P // 2 if kind == "DualPipe" else P
    for _ in range(6):
        W_ = RNG.uniform(0.2, 1.0)
        F_, B_ = W_, 2 * W_
        FB_ = RNG.uniform(F_ + W_, F_ + B_)
        m = 2 * P * int(RNG.integers(1, 4)) + (0 if kind == "DualPipe" else int(RNG.integers(0, 3)))
        r = simulate(kind, P, m, F=F_, B=B_, W=W_, FB=FB_)
        assert abs(r.bubble.max() - (half - 1) * (FB_ + B_ - 3 * W_)) < 1e-9
        assert r.bubble.min() >= -1e-9


@pytest.mark.parametrize("P", [2, 4, 8, 16])
def test_peak_activations(P):
    m = 4 * P
    one = simulate("1F1B", P, m)
    np.testing.assert_array_equal(one.peak_activations, P - np.arange(P))  # rank r: PP - r
    dp = simulate("DualPipe", P, m)
    np.testing.assert_array_equal(dp.peak_activations, np.full(P, P + 1))  # PP + 1
    dv = simulate("DualPipeV", P, m)
    np.testing.assert_array_equal(dv.peak_activations, np.full(P, 2 * P + 1))  # PP + 1, PP = 2P stages
    np.testing.assert_allclose(dv.peak_activation_memory, (2 * P + 1) / 2)


def _check_plan(kind, P, m, v=2, forward_only=False):
    plans = plan(kind, P, m, forward_only=forward_only, virtual_stages=v)
    stages_per_rank = v if kind == "interleaved" else (1 if kind in ("1F1B", "ZB1P") else 2)
    per_phase_chunks = m // 2 if kind == "DualPipe" else m
    sends = {}  # (src, dst) -> [(kind F|B)], posting order
    recvs = {}
    for r, rows in enumerate(plans):
        nf = np.zeros(stages_per_rank, int)
        nb = np.zeros(stages_per_rank, int)
        pending, zb_queue = 0, 0
        for k, zb, p, c, p1, c1 in rows:
            if k in (F, FB):
                assert c == nf[p]
                nf[p] += 1
            if k == B:
                assert c == nb[p] and c < nf[p]
                nb[p] += 1
                zb_queue += zb
            if k == FB:
                assert c1 == nb[p1] and c1 < nf[p1]
                nb[p1] += 1
            if k == W:
                assert zb_queue > 0
                zb_queue -= 1
            if k in (RECV_F, RECV_B, SEND_F, SEND_B):
                pending += 1
                peer = _peer(kind, P, r, p, k, v)
                key = (r, peer) if k in (SEND_F, SEND_B) else (peer, r)
                if kind not in ("DualPipe", "DualPipeV"):  # only the runtime's schedules need one FIFO per pair
                    key += (k in (SEND_F, RECV_F),)
                (sends if k in (SEND_F, SEND_B) else recvs).setdefault(key, []).append("F" if k in (SEND_F, RECV_F) else "B")
            if k == COMMIT:
                assert pending > 0
                pending = 0
        assert pending == 0 and zb_queue == 0
        assert (nf == per_phase_chunks).all()
        assert (nb == (0 if forward_only else per_phase_chunks)).all()
    # NCCL semantics (untagged p2p matches in posting order): per ordered pair of ranks, the
    # sender's and the receiver's message sequences agree
    assert sends == recvs


def _peer(kind, P, r, p, k, v):
    fwd = k in (SEND_F, RECV_B)  # direction of the data relative to the stage flow
    if kind in ("1F1B", "ZB1P"):
        return r + 1 if fwd else r - 1
    if kind == "interleaved":
        return (r + 1) % P if fwd else (r - 1) % P
    down = (p == 0)  # phase 0 flows to higher ranks, phase 1 to lower ranks
    return r + 1 if fwd == down else r - 1


@pytest.mark.parametrize("kind", SCHEDULES)
@pytest.mark.parametrize("P", [1, 2, 3, 4, 8])
def test_plans_are_consistent(kind, P):
    if kind == "DualPipe" and P % 2:
        pytest.skip("DualPipe needs an even number of ranks")
    for m in sorted({2 * P, 2 * P + 2, 4 * P}):
        if kind == "interleaved" and m % P:
            continue
        _check_plan(kind, P, m)
        if kind in ("DualPipe", "DualPipeV"):
            _check_plan(kind, P, m, forward_only=True)
        simulate(kind, P, m, p2p=0.3)  # raises on deadlock / unmatched messages


def test_timeline_respects_dependencies():
    P, m, lat = 4, 12, 0.25
    for kind in ("DualPipe", "DualPipeV", "ZBV", "1F1B"):
        r = simulate(kind, P, m, F=1.0, B=2.0, W=0.5, FB=2.5, p2p=lat, timeline=True)
        tl = r.timeline
        for rank in range(P):  # one op at a time per rank
            sel = tl["rank"] == rank
            s, e = tl["start"][sel], tl["end"][sel]
            assert (s[1:] >= e[:-1] - 1e-12).all()
        assert abs(tl["end"].max() - r.makespan) < 1e-12
        # makespan is at least the critical path of one micro-batch through all stages (F then B)
        n_stages = P * (2 if kind in ("DualPipeV", "ZBV") else 1)
        assert r.makespan >= n_stages * 1.0 + n_stages * 1.5 + (n_stages - 1) * lat * 0.999


@pytest.mark.parametrize("kind,P,m,match", [
    ("DualPipe", 3, 12, "even"), ("DualPipe", 4, 6, ">= 2"), ("DualPipe", 4, 9, "even"),
    ("DualPipeV", 4, 7, ">= 2"), ("ZBV", 4, 7, ">= 2"), ("interleaved", 4, 6, "multiple"),
    ("1F1B", 0, 4, "num_ranks"), ("1F1B", 4, 0, "num_chunks"), ("GPipe", 4, 8, "kind"),
])
def test_bad_arguments(kind, P, m, match):
    with pytest.raises(ValueError, match=match):
        plan(kind, P, m)
    with pytest.raises(ValueError, match=match):
        simulate(kind, P, m)


def test_bad_costs():
    with pytest.raises(ValueError, match="F"):
        simulate("1F1B", 2, 4, F=-1)
    with pytest.raises(ValueError, match="W"):
        simulate("1F1B", 2, 4, B=1, W=2)


def _groups(kind, P, m, forward_only):
    """Per rank, the p2p batches between COMMITs: [("s"|"r", sender, receiver, seq on that pair)]."""
    out = []
    for r, rows in enumerate(plan(kind, P, m, forward_only=forward_only)):
        count, groups, cur = {}, [], []
        for k, zb, p, c, p1, c1 in rows:
            if k in (RECV_F, RECV_B, SEND_F, SEND_B):
                peer = _peer(kind, P, r, p, k, 2)
                key = ("s", r, peer) if k in (SEND_F, SEND_B) else ("r", peer, r)
                count[key] = count.get(key, 0) + 1
                cur.append(key + (count[key] - 1,))
            elif k == COMMIT:
                groups.append(cur)
                cur = []
        out.append(groups)
    return out


def _blocked_ranks(groups):
    """Run every rank's batches in order, each batch ending when all its messages have moved, and a
    message moving only while its send and its receive are both in their ranks' current batch (no
    buffering: large NCCL messages rendezvous). Returns the ranks left waiting ([] = no deadlock)."""
    P, ptr, moved = len(groups), [0] * len(groups), set()
    while True:
        active = {op for r in range(P) if ptr[r] < len(groups[r]) for op in groups[r][ptr[r]]}
        new = {op for op in active - moved if (("r" if op[0] == "s" else "s"),) + op[1:] in active}
        moved |= new
        advanced = False
        for r in range(P):
            if ptr[r] < len(groups[r]) and all(op in moved for op in groups[r][ptr[r]]):
                ptr[r] += 1
                advanced = True
        if not new and not advanced:
            return [r for r in range(P) if ptr[r] < len(groups[r])]


@pytest.mark.parametrize("kind", ["DualPipe", "DualPipeV"])
@pytest.mark.parametrize("P", [2, 4, 8, 16])
def test_runtime_plans_do_not_deadlock_without_send_buffering(kind, P):
    """The runtime waits for each p2p batch before computing on (as over NCCL, where the compute stream
    waits for the batch); with activations of tens of MB a send completes only once its receive is
    posted. Every batch sequence must still drain."""
    for m in sorted({2 * P, 2 * P + 2, 2 * P + 6, 4 * P, 8 * P}):
        for forward_only in (False, True):
            assert _blocked_ranks(_groups(kind, P, m, forward_only)) == [], (kind, P, m, forward_only)


def test_deadlock_check_can_fail():
    # two ranks that each send first and receive in a later batch: both wait forever
    crossed = [[[("s", 0, 1, 0)], [("r", 1, 0, 0)]], [[("s", 1, 0, 0)], [("r", 0, 1, 0)]]]
    assert _blocked_ranks(crossed) == [0, 1]
    assert _blocked_ranks([[[("s", 0, 1, 0), ("r", 1, 0, 0)]], [[("s", 1, 0, 0), ("r", 0, 1, 0)]]]) == []
