"""Shared helpers of the benchmark scripts (run by our venv and by the original smallpond's venv).

Each benchmark script has an orchestrator mode (generates data, runs every system in its own
subprocess, prints a table, writes --json) and a worker mode (``--system NAME``) that runs one
system and prints ``RESULT {json}``. The original smallpond 0.15.0 runs from its own venv
(``--orig-python``, default /tmp/sp_orig/bin/python; create it with
``python3.11 -m venv /tmp/sp_orig && /tmp/sp_orig/bin/pip install smallpond==0.15.0 duckdb==1.2.2``).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from typing import Dict, List, Optional

ORIG_PYTHON = "/tmp/sp_orig/bin/python"


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{platform.system()} {os.cpu_count()} cores ({cpu}), Python {platform.python_version()}"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "log", "-1", "--format=%h", "--", ".."], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10).stdout.strip()
    except Exception:
        return "unknown"


def _tree_rss(sid: int) -> int:
    """Resident bytes of every process in session ``sid`` (the worker and anything it started)."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # field 6 of stat: session id
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss in pages
        except (OSError, IndexError, ValueError):
            continue
    return total


def run_worker(python: str, script: str, args: List[str], timeout: int, env: Optional[Dict[str, str]] = None,
               mem_limit_gb: Optional[float] = None) -> dict:
    """Run ``python script --system ... args`` and parse its RESULT line; errors become a dict.

    The worker runs in its own session; its process tree's resident memory is sampled every 0.2 s
    (``peak_rss_gb`` in the result) and the whole tree is killed past ``timeout`` seconds or past
    ``mem_limit_gb`` of resident memory.
    """
    import signal
    import tempfile
    full_env = dict(os.environ)
    full_env.update(env or {})
    if python != sys.executable:  # the original needs its venv's `python` and `ray` first on PATH
        full_env["PATH"] = os.path.dirname(python) + os.pathsep + full_env.get("PATH", "")
    t0 = time.time()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([python, script, *args], stdout=out, stderr=err, text=True, env=full_env,
                             start_new_session=True)
        peak, killed = 0, None
        while p.poll() is None:
            peak = max(peak, _tree_rss(p.pid))
            if time.time() - t0 > timeout:
                killed = f"timed out after {timeout}s"
            elif mem_limit_gb and peak > mem_limit_gb * 1e9:
                killed = f"killed at {peak / 1e9:.1f} GB resident (limit {mem_limit_gb:g} GB)"
            if killed:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                break
            time.sleep(0.2)
        try:
            os.killpg(p.pid, signal.SIGKILL)  # leftovers of the worker's session (e.g. a Ray node)
        except ProcessLookupError:
            pass
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    peak_gb = round(peak / 1e9, 2)
    if killed:
        return {"error": f"{killed} after {time.time() - t0:.0f}s", "peak_rss_gb": peak_gb}
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            res["process_s"] = time.time() - t0
            res["peak_rss_gb"] = peak_gb
            return res
    tail = (stdout + stderr).strip().splitlines()[-6:]
    return {"error": f"exit {p.returncode}: " + " | ".join(tail)[-600:], "peak_rss_gb": peak_gb}


def emit(result: dict) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def print_table(title: str, rows: List[dict], cols: List[tuple]) -> None:
    print(f"\n{title}")
    header = "".join(f"{name:>{w}}" if i else f"{name:<{w}}" for i, (name, _, w) in enumerate(cols))
    print(header)
    print("-" * len(header))
    for r in rows:
        cells = []
        for i, (name, fmt, w) in enumerate(cols):
            v = fmt(r)
            cells.append(f"{v:>{w}}" if i else f"{v:<{w}}")
        print("".join(cells))
