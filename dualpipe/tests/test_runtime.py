"""DualPipe / DualPipeV on 2, 4 and 8 gloo processes (float64) against the non-pipelined oracle.

For every case each rank checks: loss and outputs equal the reference (relative 1e-12), every
parameter gradient matches (the two DualPipe copies of a stage summed), and the ops the runtime
executed (with its own micro-batch counters) are exactly the planner's op list for that rank.
One launch per world size runs all cases (process start-up dominates the cost).
"""
import pytest

from dualpipe._testing import launch

TOL = 1e-12


def runtime_cases(P):
    cases = []
    for kind in ("DualPipe", "DualPipeV"):
        larger = 2 * P + (6 if kind == "DualPipe" else 3)
        for chunks in (2 * P, larger):
            for overlap in (False, True):
                for ret in (False, True):
                    cases.append(dict(kind=kind, num_chunks=chunks, overlap=overlap, return_outputs=ret, trace=True))
        for overlap in (False, True):  # inference (torch.no_grad): forward-only plan
            cases.append(dict(kind=kind, num_chunks=2 * P, overlap=overlap, return_outputs=True,
                              forward_only=True, trace=True))
    if P == 4:  # a permuted rank mapping
        for kind in ("DualPipe", "DualPipeV"):
            cases.append(dict(kind=kind, num_chunks=12, overlap=True, return_outputs=True, trace=True,
                              rank_mapping=[2, 0, 3, 1]))
    if P == 2:  # 1-rank DualPipeV on a subgroup (the V turns on the only rank)
        for ret in (False, True):
            cases.append(dict(kind="DualPipeV", num_chunks=3, overlap=ret, return_outputs=ret, trace=True, subgroup=[1]))
    return cases


@pytest.fixture(scope="module", params=[2, 4, 8], ids=lambda p: f"{p}proc")
def launched(request):
    P = request.param
    cases = runtime_cases(P)
    return P, cases, launch(P, cases, timeout_s=240)


def test_all_cases_match_reference(launched):
    P, cases, outs = launched
    for o in outs:
        assert o["error"] is None, o["error"]
    bad = []
    for o in outs:
        for case, res in zip(cases, o["results"]):
            if res is None:
                continue
            for key in ("loss", "outputs", "grads"):
                if not res[key] <= TOL:
                    bad.append((o["rank"], case, key, res[key]))
            if res.get("trace_ok") != 1.0:
                bad.append((o["rank"], case, "trace", res.get("trace_ok")))
    assert not bad, bad[:5]


def test_every_rank_checked_every_case(launched):
    P, cases, outs = launched
    assert len(outs) == P
    for o in outs:
        assert len(o["results"]) == len(cases)
    # the subgroup case ran on its member only
    for i, case in enumerate(cases):
        members = case.get("subgroup", range(P))
        assert all((outs[r]["results"][i] is not None) == (r in members) for r in range(P))
