"""Resume: kill a job mid-way, re-run it, and only the missing tasks are computed."""
import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

JOB = textwrap.dedent("""
    import sys, time
    import smallpond
    root, out = sys.argv[1], sys.argv[2]
    sp = smallpond.init(job_id="resume-test", data_root=root, num_executors=1, progress=False)
    df = sp.from_items(list(range(800))).repartition(8, by_rows=True)
    def slow(t):
        time.sleep(0.4)
        return t
    df = df.map_batches(slow)
    df = sp.partial_sql("select item, item * 2 as twice from {0}", df)
    df.write_parquet(out)
    stage = [s for s in sp.stages if s.name.startswith("ArrowBatchNode")][0]
    print("RESULT", sp._driver.tasks_run, stage.cached, df.count())
    sp.shutdown()
""")


def _markers(root):
    return sorted(glob.glob(os.path.join(root, "resume-test", "tasks", "ArrowBatchNode", "*", "_SUCCESS.json")))


def test_resume_after_kill(tmp_path):
    root, out = str(tmp_path / "root"), str(tmp_path / "out")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    proc = subprocess.Popen([sys.executable, str(script), root, out], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while len(_markers(root)) < 3 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its workers, mid-job
        proc.wait(10)
    done = _markers(root)
    assert 3 <= len(done) < 8, f"expected a partial job, found {len(done)} finished tasks"
    mtimes = {p: os.stat(p).st_mtime_ns for p in done}
    assert not os.path.exists(out)  # no partial final output

    res = subprocess.run([sys.executable, str(script), root, out], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    line = [l for l in res.stdout.splitlines() if l.startswith("RESULT")][0]
    tasks_run, cached, count = map(int, line.split()[1:])
    assert cached == len(done)                     # finished tasks were not recomputed
    assert tasks_run == (8 - len(done)) + 8        # the missing map tasks + the 8 SQL tasks
    assert count == 800
    assert all(os.stat(p).st_mtime_ns == m for p, m in mtimes.items())
    assert not glob.glob(os.path.join(root, "resume-test", "tasks", "*", "*.tmp-*"))  # killed attempts cleaned
    import duckdb
    got = duckdb.sql(f"select count(*), sum(item), sum(twice) from read_parquet('{out}/*.parquet')").fetchall()[0]
    assert got == (800, sum(range(800)), 2 * sum(range(800)))
