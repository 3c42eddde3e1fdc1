"""The example of the original EPLB README, through both the C++ core and the reference."""
import pytest
import torch

import eplb
from eplb import ref

WEIGHT = torch.tensor([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                       [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]])
PHY2LOG = [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
           [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]


@pytest.mark.parametrize("impl", [eplb.rebalance_experts, ref.rebalance_experts])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.float64])
def test_readme_example(impl, dtype):
    phy2log, log2phy, logcnt = impl(WEIGHT.to(dtype), 16, 4, 2, 8)
    assert phy2log.tolist() == PHY2LOG
    assert phy2log.dtype == log2phy.dtype == logcnt.dtype == torch.int64
    assert log2phy.shape == (2, 12, int(logcnt.max()))
    # each slot appears exactly once in log2phy, under its own expert
    for l in range(2):
        for e in range(12):
            slots = log2phy[l, e][log2phy[l, e] >= 0]
            assert len(slots) == logcnt[l, e]
            assert (phy2log[l, slots] == e).all()
        assert sorted(log2phy[l][log2phy[l] >= 0].tolist()) == list(range(16))
