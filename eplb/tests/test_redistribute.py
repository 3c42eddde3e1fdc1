"""Per-batch token split: exact against scipy's LP optimum, and consistent with the plan."""
import math

import numpy as np
import pytest
import torch

import eplb
from conftest import random_load

linprog = pytest.importorskip("scipy.optimize").linprog


def lp_optimum(phy2log, tokens, gpus):
    """min z s.t. x >= 0, sum_r x_r = t_e per expert, sum over a GPU's slots x_r <= z."""
    R = len(phy2log)
    A_eq = np.zeros((len(tokens), R + 1))
    A_eq[phy2log, np.arange(R)] = 1
    A_ub = np.zeros((gpus, R + 1))
    A_ub[np.arange(R) // (R // gpus), np.arange(R)] = 1
    A_ub[:, -1] = -1
    c = np.zeros(R + 1)
    c[-1] = 1
    res = linprog(c, A_ub=A_ub, b_ub=np.zeros(gpus), A_eq=A_eq, b_eq=tokens, method="highs")
    assert res.status == 0
    return res.fun


@pytest.mark.parametrize("shape", [(12, 16, 8, 4, 2), (64, 96, 16, 8, 2), (256, 288, 32, 8, 4), (256, 288, 32, 1, 4)])
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_against_linprog(shape, seed):
    E, R, gpus, groups, nodes = shape
    w = random_load(seed + E, 3, E, s=1.2)
    phy2log = eplb.rebalance_experts(w, R, groups, nodes, gpus, refine=seed == 1)[0]
    g = torch.Generator().manual_seed(seed)
    tokens = torch.stack([torch.bincount(torch.multinomial(row + 1, 4096, True, generator=g), minlength=E)
                          for row in w])
    out = torch.full((3, R), -1, dtype=torch.long)  # poison: every entry must be overwritten
    out[:] = eplb.redistribute_tokens(phy2log, tokens, gpus)
    assert (out >= 0).all()
    per_expert = torch.zeros(3, E, dtype=torch.long).scatter_add_(1, phy2log, out)
    assert torch.equal(per_expert, tokens)
    for l in range(3):
        best = out[l].view(gpus, -1).sum(-1).max().item()
        opt = lp_optimum(phy2log[l].numpy(), tokens[l].numpy().astype(float), gpus)
        assert best == math.ceil(opt - 1e-6)
        even = eplb.evaluate(tokens[l:l + 1], phy2log[l:l + 1], gpus).gpu_load.max().item()
        assert best <= math.ceil(even)


def test_one_dimensional_and_empty_batch():
    phy2log = torch.tensor([0, 1, 0, 2])
    out = eplb.redistribute_tokens(phy2log, torch.tensor([10, 3, 4]), 2)
    assert out.shape == (4,) and out.sum() == 17
    assert out.view(2, 2).sum(-1).max() == 9  # {0:10} over both GPUs: 9 / 8
    assert eplb.redistribute_tokens(phy2log, torch.zeros(3, dtype=torch.long), 2).tolist() == [0] * 4
