"""threefs:// paths: through a mount point, and through the threefs client (real local cluster)."""
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import smallpond


def test_threefs_mount_point(tmp_path):
    mount = tmp_path / "mnt"
    (mount / "in").mkdir(parents=True)
    t = pa.table({"k": np.arange(100) % 7, "v": np.arange(100)})
    pq.write_table(t, mount / "in" / "a.parquet")
    sp = smallpond.init(job_id="3fs-mount", data_root=str(tmp_path / "root"), num_executors=1, progress=False,
                        threefs_mount=str(mount))
    try:
        df = sp.read_parquet("threefs://in/*.parquet").repartition(3, hash_by="k")
        df = sp.partial_sql("select k, sum(v) as s from {0} group by k", df)
        df.write_parquet("threefs://out")
        got = pq.read_table(str(mount / "out")).to_pandas().sort_values("k")
        assert got.s.tolist() == t.to_pandas().groupby("k").v.sum().tolist()
    finally:
        sp.shutdown()


def test_threefs_path_without_client_or_mount(tmp_path, monkeypatch):
    monkeypatch.delenv("SP_THREEFS_MOUNT", raising=False)
    monkeypatch.delenv("SP_THREEFS_MGMTD", raising=False)
    sp = smallpond.init(job_id="3fs-none", data_root=str(tmp_path / "root"), num_executors=1, progress=False)
    try:
        with pytest.raises(ValueError, match="threefs:// needs the threefs client"):
            sp.read_parquet("threefs://x/y.parquet").count()
    finally:
        sp.shutdown()


@pytest.fixture
def threefs_cluster(tmp_path):
    threefs = pytest.importorskip("threefs")
    d = tmp_path / "3fs"
    cmd = [sys.executable, "-m", "threefs", "cluster"]
    try:
        up = subprocess.run(cmd + ["up", "--dir", str(d), "--storage-nodes", "1", "--replicas", "1"],
                            capture_output=True, text=True, timeout=60)
        ok = up.returncode == 0
        why = up.stderr[-300:]
    except subprocess.TimeoutExpired:
        ok, why = False, "timed out"
    try:
        if not ok:
            pytest.skip(f"threefs cluster did not start: {why}")
        info = json.loads((d / "cluster.json").read_text())
        yield threefs, {"mgmtd": info["mgmtd"], "secret": info["secret"]}
    finally:
        try:
            subprocess.run(cmd + ["down", "--dir", str(d)], capture_output=True, timeout=60)
        except subprocess.TimeoutExpired:
            pass
        _kill_cluster_processes(d)


def _kill_cluster_processes(d):
    """Kill, by pid, any service of the cluster this test started that is still running."""
    import signal
    try:
        procs = json.loads((d / "cluster.json").read_text()).get("processes", {})
    except (OSError, ValueError):
        return
    for p in procs.values():
        pid = p.get("pid")
        if isinstance(pid, int):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if str(d).encode() not in f.read():
                        continue  # the pid was reused by another process
                os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass


def test_threefs_client(tmp_path, threefs_cluster):
    threefs, options = threefs_cluster
    client = threefs.Client(**options)
    t = pa.table({"k": np.arange(200) % 5, "v": np.arange(200, dtype=np.float64)})
    local = tmp_path / "a.parquet"
    pq.write_table(t, local)
    client.makedirs("/data")
    with client.open("/data/a.parquet", "wb") as f:
        f.write(local.read_bytes())
    sp = smallpond.init(job_id="3fs-client", data_root=str(tmp_path / "root"), num_executors=1, progress=False,
                        threefs_options=options)
    try:
        df = sp.read_parquet("threefs:///data/*.parquet").repartition(2, hash_by="k")
        df = sp.partial_sql("select k, count(*) as n from {0} group by k", df)
        df.write_parquet("threefs:///results")
        names = sorted(client.listdir("/results"))
        assert len(names) == 2 and not any("__tmp" in n for n in client.listdir("/"))
        rows = []
        for n in names:
            with client.open(f"/results/{n}", "rb") as f:
                data = f.read()
            rows += pq.read_table(pa.BufferReader(data)).to_pylist()
        assert sorted((r["k"], r["n"]) for r in rows) == [(k, 40) for k in range(5)]
    finally:
        sp.shutdown()
        client.close()
