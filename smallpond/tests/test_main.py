import subprocess
import sys


def test_main_job_small(tmp_path):
    res = subprocess.run([sys.executable, "-m", "smallpond", "--rows", "30000", "--partitions", "3",
                          "--data-root", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[-1].startswith("summary: backend=CPU result=pipeline matches DuckDB (30000 rows")
    assert any(l.startswith("HashPartitionNode") for l in lines)
    assert (tmp_path / "root" / "demo" / "report.html").exists()


def test_version():
    res = subprocess.run([sys.executable, "-m", "smallpond", "--version"], capture_output=True, text=True, timeout=60)
    assert res.stdout.startswith("smallpond ")
