"""The multi-GPU step benchmark (benchmarks/bench_gpu_step.py), checked on the CPU.

* Its transformer block computes the same gradients whether the weight matmuls go through our
  WeightGradStore split (as under DualPipe/DualPipeV) or through plain autograd (as under
  torch.distributed.pipelining), so both frameworks time the same math.
* A 2-process gloo dry run (tiny sizes) produces a row per schedule with a step time, a measured
  bubble in [0, 1), per-rank timelines and a simulator prediction.
"""
import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest
import torch

from dualpipe import WeightGradStore

BENCH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "bench_gpu_step.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_gpu_step", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("mb", [1, 2])
def test_block_zb_split_matches_plain_autograd(mb):
    b = _load()
    cfg = dict(b.SIZES["cpu"], dtype="float64")
    x = torch.randn(mb, cfg["seq"], cfg["hidden"], dtype=torch.float64)
    g = torch.randn_like(x)
    grads = {}
    for zb in (False, True):
        stage = b.make_stage(3, 2, cfg, zb, torch.device("cpu"))
        xi = x.clone().requires_grad_()
        out = stage(xi)
        WeightGradStore.clear()
        WeightGradStore.enabled = zb
        try:
            out.backward(g)
        finally:
            WeightGradStore.enabled = False
        if zb:
            assert all(p.grad is None for p in stage.parameters())  # every weight grad was deferred
            WeightGradStore.flush()
            WeightGradStore.pop()
        grads[zb] = [xi.grad] + [p.grad for p in stage.parameters()]
    assert len(grads[True]) == 1 + 2 * 6
    for a, c in zip(grads[False], grads[True]):
        assert c is not None and torch.allclose(a, c, rtol=1e-10, atol=1e-12)


def test_cpu_dry_run_two_processes(tmp_path):
    out = tmp_path / "b.json"
    cmd = [sys.executable, str(BENCH), "--device", "cpu", "--procs", "2", "--quick", "--timeout", "150",
           "--only", "DualPipeV,DualPipe,ScheduleZBVZeroBubble", "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=200)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "summary: backend=gloo worlds=[2] result=ok" in p.stdout
    (world,) = json.loads(out.read_text())["worlds"]
    rows = {r["schedule"]: r for r in world["rows"]}
    assert set(rows) == {"DualPipeV", "DualPipe", "ScheduleZBVZeroBubble"}
    for r in rows.values():
        assert r["chunks"] == 8 and r["step_s"] > 0 and 0 <= r["bubble"] < 1
        assert r["simulated_s"] > 0 and len(r["timeline_ms"]) == 2
        # forwards timed (alone or inside F&B ops) = steps x ranks x micro-batches x stages per rank,
        # DualPipe's two stages each seeing half of the micro-batches
        n = r["op_counts"]["F"] + r["op_counts"].get("FB", 0)
        assert n == 3 * 2 * 8 * (1 if r["schedule"] == "DualPipe" else 2), (r["schedule"], r["op_counts"])
    assert "W" in rows["ScheduleZBVZeroBubble"]["op_mean_s"] and "W" in rows["DualPipeV"]["op_mean_s"]
