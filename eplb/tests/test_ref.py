"""The C++ core with default options must reproduce the plain-PyTorch reference exactly."""
import pytest
import torch

import eplb
from eplb import ref
from conftest import random_load

# (layers, experts, replicas, groups, nodes, gpus): hierarchical and global (groups % nodes != 0)
CASES = [(3, 12, 16, 4, 2, 8), (4, 64, 80, 8, 2, 16), (5, 256, 288, 8, 4, 32),
         (3, 256, 288, 1, 4, 32), (2, 256, 320, 8, 8, 64), (2, 256, 288, 8, 4, 144),
         (2, 64, 64, 4, 2, 8), (2, 16, 32, 3, 2, 4), (1, 32, 64, 4, 4, 64), (0, 16, 32, 4, 2, 8)]


def check_plan(phy2log, log2phy, logcnt, L, E, R):
    assert phy2log.shape == (L, R) and logcnt.shape == (L, E)
    assert (logcnt >= 1).all() and (logcnt.sum(-1) == R).all()
    counts = torch.zeros(L, E, dtype=torch.long).scatter_add_(1, phy2log, torch.ones_like(phy2log))
    assert torch.equal(counts, logcnt)
    valid = log2phy >= 0
    assert torch.equal(valid.sum(-1), logcnt)
    layer = torch.arange(L).view(L, 1, 1).expand_as(log2phy)
    expert = torch.arange(E).view(1, E, 1).expand_as(log2phy)
    assert torch.equal(phy2log[layer[valid], log2phy[valid]], expert[valid])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_reference(case, seed):
    L, E, R, groups, nodes, gpus = case
    if groups > E:
        groups = 1
    w = random_load(seed * 100 + E, L, E, s=1.2)
    got = eplb.rebalance_experts(w, R, groups, nodes, gpus)
    want = ref.rebalance_experts(w, R, groups, nodes, gpus)
    for g, r in zip(got, want):
        assert torch.equal(g, r)
    check_plan(*got, L, E, R)


def test_float_and_device_inputs_agree():
    w = random_load(3, 4, 64)
    a = eplb.rebalance_experts(w.float(), 96, 8, 2, 16)
    b = eplb.rebalance_experts(w.long(), 96, 8, 2, 16)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_zero_and_equal_loads():
    for w in (torch.zeros(2, 32), torch.ones(2, 32)):
        got = eplb.rebalance_experts(w, 48, 4, 2, 8)
        want = ref.rebalance_experts(w, 48, 4, 2, 8)
        assert all(torch.equal(x, y) for x, y in zip(got, want))
    m = eplb.evaluate(torch.zeros(2, 32), got[0], 8, 2)
    assert torch.equal(m.imbalance, torch.ones(2))


def test_metrics_against_hand_computation():
    w = torch.tensor([[6.0, 2.0, 4.0, 0.0]])
    phy2log = torch.tensor([[0, 1, 0, 2, 3, 2]])  # expert 0 and 2 twice; GPUs hold 2 slots
    m = eplb.evaluate(w, phy2log, num_gpus=3, num_nodes=1)
    assert m.gpu_load.tolist() == [[5.0, 5.0, 2.0]]
    assert m.imbalance.item() == pytest.approx(5.0 / 4.0)
    m = eplb.evaluate(w, phy2log, num_gpus=3, num_nodes=3, previous=torch.tensor([[0, 1, 2, 2, 3, 0]]))
    assert m.moved.tolist() == [2]
    assert m.node_imbalance.item() == pytest.approx(5.0 / 4.0)
