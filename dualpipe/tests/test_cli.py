"""`python -m dualpipe`: version, the simulate table + summary line, --plot, and `run` (2 processes)."""
import os
import subprocess
import sys

import pytest


def _run(*args, timeout=120):
    p = subprocess.run([sys.executable, "-m", "dualpipe", *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def test_version():
    import dualpipe
    rc, out, _ = _run("--version")
    assert rc == 0 and out.strip() == f"dualpipe {dualpipe.__version__}"


def test_simulate_prints_table_and_summary():
    rc, out, err = _run("--ranks", "4", "--chunks", "8", "--F", "1", "--B", "2", "--W", "1")
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert lines[-1].startswith("summary: backend=CPU result=")
    for kind in ("1F1B", "ZB1P", "interleaved", "ZBV", "DualPipe", "DualPipeV"):
        assert any(l.startswith(kind + " ") for l in lines), kind
    # the 1F1B row: makespan (m + P - 1)(F + B) = 33, published bubble (P-1)(F+B) = 9
    row = next(l for l in lines if l.startswith("1F1B ")).split()
    assert float(row[1]) == 33.0 and float(row[3]) == 9.0 and float(row[4]) == 9.0
    assert "rank   3 |" in out  # text Gantt


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "g.png"
    rc, out, err = _run("--ranks", "4", "--chunks", "8", "--quiet", "--plot", str(path))
    assert rc == 0, err
    assert path.exists() and path.read_bytes()[:4] == b"\x89PNG" and os.path.getsize(path) > 10_000


def test_bad_arguments_fail_clearly():
    rc, out, err = _run("--ranks", "3", "--chunks", "4", "--kinds", "DualPipe")
    assert rc != 0 and "even" in err


def test_run_checks_against_reference():
    rc, out, err = _run("run", "--procs", "2", "--chunks", "4", timeout=240)
    assert rc == 0, out + err
    assert out.strip().splitlines()[-1].startswith("summary: backend=CPU result=pass")
