"""The planner + simulator keep their complexity: 1,024 ranks x 8,192 micro-batches in a few CPU seconds.

The sub-second figure itself is a benchmark (`benchmarks/bench_simulated.py`, second table; BENCHMARKS.md):
0.3-0.8 s per schedule on the development VM of session 14, but up to 0.94 s on the H200 host and 1.9 s on a
slower VM in session 23, where the former 1 s assertion failed three schedules of a fresh-clone `ci/test`.
This test keeps a bound about twice the slowest of those, so that it catches a change of complexity (an
unrolled steady state, a simulator that rescans the plans) rather than the speed of the machine."""
import time

import pytest

from dualpipe import simulate

CPU_SECONDS_BOUND = 4.0


@pytest.mark.parametrize("kind", ["DualPipe", "DualPipeV", "1F1B", "ZB1P", "interleaved", "ZBV"])
def test_plan_and_simulate_1024_ranks_8192_chunks(kind):
    best = float("inf")
    for _ in range(2):  # best of two: the CI machine is shared
        t0 = time.process_time()
        r = simulate(kind, 1024, 8192, F=1.0, B=2.0, W=1.0, FB=2.5)
        best = min(best, time.process_time() - t0)
    assert r.num_ranks == 1024 and r.makespan > 8192
    assert best < CPU_SECONDS_BOUND, f"{kind}: {best:.3f} s CPU"
