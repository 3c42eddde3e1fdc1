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


def run_worker(python: str, script: str, args: List[str], timeout: int, env: Optional[Dict[str, str]] = None) -> dict:
    """Run ``python script --system ... args`` and parse its RESULT line; errors become a dict."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    if python != sys.executable:  # the original needs its venv's `python` and `ray` first on PATH
        full_env["PATH"] = os.path.dirname(python) + os.pathsep + full_env.get("PATH", "")
    t0 = time.time()
    try:
        p = subprocess.run([python, script, *args], capture_output=True, text=True, timeout=timeout,
                           env=full_env, start_new_session=True)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout}s"}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            out = json.loads(line[7:])
            out["process_s"] = time.time() - t0
            return out
    tail = (p.stdout + p.stderr).strip().splitlines()[-6:]
    return {"error": f"exit {p.returncode}: " + " | ".join(tail)[-600:]}


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
