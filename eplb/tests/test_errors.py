"""Bad inputs raise clear errors that name the argument."""
import pytest
import torch

import eplb

W = torch.rand(2, 16)


@pytest.mark.parametrize("args,kwargs,exc,word", [
    ((W[0], 32, 4, 2, 8), {}, ValueError, "weight"),                        # 1-D
    ((W.tolist(), 32, 4, 2, 8), {}, TypeError, "weight"),                   # not a tensor
    ((W.bool(), 32, 4, 2, 8), {}, TypeError, "weight"),
    ((torch.full((2, 16), float("nan")), 32, 4, 2, 8), {}, ValueError, "weight"),
    ((-W, 32, 4, 2, 8), {}, ValueError, "non-negative"),
    ((W, 30, 4, 2, 8), {}, ValueError, "multiple of num_gpus"),
    ((W, 8, 4, 2, 8), {}, ValueError, "num_replicas"),                       # fewer slots than experts
    ((W, 32, 6, 2, 8), {}, ValueError, "num_groups"),                        # 16 % 6
    ((W, 32, 4, 3, 8), {}, ValueError, "num_gpus"),                          # 8 % 3
    ((W, 32, 4, 2, 0), {}, ValueError, "num_gpus"),
    ((W, 32.0, 4, 2, 8), {}, TypeError, "num_replicas"),
    ((W, 32, 4, 2, 8), {"previous": torch.zeros(2, 31, dtype=torch.long)}, ValueError, "previous"),
    ((W, 32, 4, 2, 8), {"previous": torch.zeros(2, 32, dtype=torch.long)}, ValueError, "previous"),
    ((W, 32, 4, 2, 8), {"previous": torch.zeros(2, 32)}, TypeError, "previous"),
    ((W, 32, 4, 2, 8), {"migration_tolerance": -1}, ValueError, "migration_tolerance"),
])
def test_rebalance_rejects(args, kwargs, exc, word):
    with pytest.raises(exc, match=word):
        eplb.rebalance_experts(*args, **kwargs)


def test_redistribute_rejects():
    p = torch.arange(16).repeat(2, 1)
    with pytest.raises(TypeError, match="tokens"):
        eplb.redistribute_tokens(p, torch.ones(2, 16), 4)
    with pytest.raises(ValueError, match="tokens"):
        eplb.redistribute_tokens(p, -torch.ones(2, 16, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="multiple of num_gpus"):
        eplb.redistribute_tokens(p, torch.ones(2, 16, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="phy2log"):
        eplb.redistribute_tokens(p[:, :8], torch.ones(2, 16, dtype=torch.long), 4)


def test_evaluate_rejects():
    with pytest.raises(ValueError, match="phy2log"):
        eplb.evaluate(W, torch.arange(16).repeat(2, 1), 3)
