import os

import pytest
import torch


def pytest_configure(config):
    for m in ("gpu: needs a CUDA device", "multigpu: needs >= 2 CUDA devices", "slow: long-running"):
        config.addinivalue_line("markers", m)


def pytest_collection_modifyitems(config, items):
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and n < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        # DUALPIPE_MULTIGPU_ON_CPU=1: the multigpu runtime tests run on gloo/CPU (a dry run)
        if "multigpu" in item.keywords and n < 2 and os.environ.get("DUALPIPE_MULTIGPU_ON_CPU") != "1":
            item.add_marker(pytest.mark.skip(reason="needs >= 2 CUDA devices"))
