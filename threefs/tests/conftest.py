import pytest


def pytest_configure(config):
    for m in ("gpu: needs a CUDA device", "multigpu: needs >= 2 CUDA devices",
              "slow: long-running"):
        config.addinivalue_line("markers", m)


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    skip = pytest.mark.skip(reason="needs CUDA")
    for it in items:
        if "gpu" in it.keywords and not has_cuda:
            it.add_marker(skip)
