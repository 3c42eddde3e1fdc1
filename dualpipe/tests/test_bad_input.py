"""Bad input: a clear ValueError/TypeError on every rank, before any p2p communication (no hang)."""
import pytest
import torch

import dualpipe
from dualpipe._testing import launch

BAD = [
    ("modules", "DualPipeV", TypeError, "pair"),
    ("modules_type", "DualPipe", TypeError, "pair"),
    ("num_chunks_small", "DualPipe", ValueError, "num_chunks"),
    ("num_chunks_odd", "DualPipe", ValueError, "even"),
    ("num_chunks_small", "DualPipeV", ValueError, "num_chunks"),
    ("batch_split", "DualPipe", ValueError, "rejected|does not split"),
    ("batch_split", "DualPipeV", ValueError, "rejected|does not split"),
    ("p2p_shape", "DualPipeV", ValueError, "p2p tensor shapes"),
    ("p2p_dtype", "DualPipe", ValueError, "p2p tensor shapes"),
    ("num_chunks_mismatch", "DualPipeV", ValueError, "num_chunks differs"),
    ("no_criterion", "DualPipe", ValueError, "rejected|criterion"),
]


@pytest.fixture(scope="module")
def launched():
    cases = [dict(what=w, kind=k, expect_error=True) for w, k, _, _ in BAD]
    cases.append(dict(what="odd_ranks", kind="DualPipe", expect_error=True, subgroup=[0, 1, 2]))
    # the group still works after all of that
    cases.append(dict(kind="DualPipe", num_chunks=8, overlap=True, return_outputs=True, trace=True))
    return cases, launch(4, cases, timeout_s=180)


def test_every_rank_raises(launched):
    cases, outs = launched
    for o in outs:
        assert o["error"] is None, o["error"]
    import re
    for i, (what, kind, exc, pattern) in enumerate(BAD):
        for o in outs:
            res = o["results"][i]
            assert res["raised"] == exc.__name__, (what, kind, o["rank"], res)
            assert re.search(pattern, res["message"]), (what, kind, o["rank"], res["message"])


def test_odd_rank_count_for_dualpipe(launched):
    cases, outs = launched
    i = len(BAD)
    for o in outs:
        res = o["results"][i]
        if o["rank"] < 3:
            assert res["raised"] == "ValueError" and "even number" in res["message"], res
        else:
            assert res is None


def test_group_usable_after_errors(launched):
    cases, outs = launched
    for o in outs:
        res = o["results"][-1]
        assert res["loss"] <= 1e-12 and res["grads"] <= 1e-12 and res["trace_ok"] == 1.0, res


def test_p2p_setters_validate():
    with pytest.raises(TypeError, match="shapes"):
        dualpipe.set_p2p_tensor_shapes((4, 8))
    with pytest.raises(TypeError, match="shape"):
        dualpipe.set_p2p_tensor_shapes([(4, "8")])
    with pytest.raises(TypeError, match="dtype"):
        dualpipe.set_p2p_tensor_dtype("float32")


def test_needs_initialized_process_group():
    if torch.distributed.is_initialized():
        pytest.skip("a process group exists in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        dualpipe.DualPipeV((torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)))
