"""Ray executor end to end, against a local Ray head (started here, stopped in teardown)."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

ray = pytest.importorskip("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    port = _free_port()
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    tmp = tmp_path_factory.mktemp("ray")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    cmd = [ray_bin, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
           "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
           f"--object-store-memory={100 << 20}", f"--temp-dir={tmp}"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    address = f"127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"ray head exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("ray head did not start within 90 s")
    yield address
    for pid in [proc.pid] + _descendants(proc.pid):  # the head and every Ray process it started
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(10)


def _descendants(root: int):
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, stack = [], [root]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def test_ray_executor_end_to_end(ray_head, tmp_path):
    import smallpond
    rng = np.random.default_rng(3)
    pdf = pd.DataFrame({"k": rng.integers(0, 30, 3000), "v": rng.random(3000)})
    sp = smallpond.init(job_id="ray", data_root=str(tmp_path / "root"), ray_address=ray_head, progress=False)
    try:
        df = sp.from_pandas(pdf).repartition(4, by_rows=True).repartition(3, hash_by="k")
        df = sp.partial_sql("select k, count(*) as n, sum(v) as s from {0} group by k", df)
        df = df.map_batches(lambda t: t.append_column("pid", __import__("pyarrow").array([os.getpid()] * t.num_rows)))
        got = df.to_pandas().sort_values("k").reset_index(drop=True)
        want = pdf.groupby("k").agg(n=("v", "size"), s=("v", "sum")).reset_index()
        assert got.k.tolist() == want.k.tolist() and got.n.tolist() == want.n.tolist()
        np.testing.assert_allclose(got.s, want.s, rtol=1e-12)
        assert os.getpid() not in set(got.pid)       # ran in Ray workers, not in the driver
        workers = {r.worker for s in sp.stages for r in s.results}
        assert len(workers) >= 2                    # spread over the head's 2 worker processes
    finally:
        sp.shutdown()
