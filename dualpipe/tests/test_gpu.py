"""On one CUDA device: a 1-rank DualPipeV smoke test over NCCL, stepped on a side stream."""
import json
import subprocess
import sys

import pytest


@pytest.mark.gpu
def test_dualpipev_one_rank_cuda_side_stream():
    from dualpipe._testing import free_port
    code = ("import json, sys; from dualpipe._testing import gpu_smoke; "
            f"print(json.dumps(gpu_smoke({free_port()})))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    errs = json.loads(p.stdout.strip().splitlines()[-1])
    assert errs and all(v <= 1e-12 for v in errs.values()), errs
