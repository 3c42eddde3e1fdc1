import pytest
import torch


def pytest_configure(config):
    for m in ("gpu: needs a CUDA device", "multigpu: needs >= 2 CUDA devices", "slow: long-running"):
        config.addinivalue_line("markers", m)


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)


def random_load(seed: int, layers: int, experts: int, s: float = 1.0) -> torch.Tensor:
    """Integer token counts (so float sums are exact): shuffled Zipf-like popularity with noise."""
    g = torch.Generator().manual_seed(seed)
    rank = torch.rand(layers, experts, generator=g).argsort(-1).double() + 1
    noise = torch.exp(0.5 * torch.randn(layers, experts, generator=g, dtype=torch.float64))
    return (5000 * rank.pow(-s) * noise).round()
