"""The planner + simulator handle 1,024 ranks x 8,192 micro-batches in under a second (CPU time)."""
import time

import pytest

from dualpipe import simulate


@pytest.mark.parametrize("kind", ["DualPipe", "DualPipeV", "1F1B", "ZB1P", "interleaved", "ZBV"])
def test_plan_and_simulate_1024_ranks_8192_chunks(kind):
    best = float("inf")
    for _ in range(2):  # best of two: the CI machine is shared
        t0 = time.process_time()
        r = simulate(kind, 1024, 8192, F=1.0, B=2.0, W=1.0, FB=2.5)
        best = min(best, time.process_time() - t0)
    assert r.num_ranks == 1024 and r.makespan > 8192
    assert best < 1.0, f"{kind}: {best:.3f} s CPU"
