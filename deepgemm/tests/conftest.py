import pytest
import torch


def pytest_configure(config):
    for m in ("gpu: needs a CUDA device", "multigpu: needs >= 2 CUDA devices", "slow: long-running"):
        config.addinivalue_line("markers", m)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords or "multigpu" in item.keywords:
            item.add_marker(skip)
