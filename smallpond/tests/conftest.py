import os

import pytest


def pytest_configure(config):
    for m in ("gpu: needs a CUDA device", "multigpu: needs >= 2 CUDA devices", "slow: long-running"):
        config.addinivalue_line("markers", m)


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="smallpond has no CUDA code; gpu tests do not apply")
    for item in items:
        if "gpu" in item.keywords or "multigpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sp_session(tmp_path_factory):
    """One local session (2 worker processes) shared by the API tests."""
    import smallpond
    sp = smallpond.init(job_id="tests", data_root=str(tmp_path_factory.mktemp("sp")), num_executors=2,
                        progress=False, memory_limit="512MB")
    yield sp
    sp.shutdown()
