"""`python -m eplb`: demo, version, plan subcommand."""
import json
import subprocess
import sys

import numpy as np
import torch

import eplb
from conftest import random_load


def run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "eplb", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_demo_ends_with_summary_and_plots(tmp_path):
    r = run("--layers", "6", "--plot", "p.png", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("summary: backend=CPU result=")
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert run("--version", cwd=tmp_path).stdout.strip() == f"eplb {eplb.__version__}"


def test_plan_from_csv_and_npy(tmp_path):
    w = random_load(0, 3, 64)
    np.savetxt(tmp_path / "load.csv", w.numpy(), delimiter=",")
    r = run("plan", "--load", "load.csv", "--num-replicas", "96", "--num-groups", "8",
            "--num-nodes", "2", "--num-gpus", "16", "--out", "plan.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    want = eplb.rebalance_experts(w, 96, 8, 2, 16)
    assert plan["phy2log"] == want[0].tolist() and plan["logcnt"] == want[2].tolist()
    np.save(tmp_path / "load.npy", w.numpy())
    r = run("plan", "--load", "load.npy", "--num-replicas", "96", "--num-groups", "8", "--num-nodes",
            "2", "--num-gpus", "16", "--refine", "--previous", "plan.json", "--out", "plan.pt", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    pt = torch.load(tmp_path / "plan.pt")
    assert pt["phy2log"].shape == (3, 96) and "moved" in pt["metrics"]


def test_plan_bad_input_is_a_clear_error(tmp_path):
    np.savetxt(tmp_path / "load.csv", -np.ones((2, 16)), delimiter=",")
    r = run("plan", "--load", "load.csv", "--num-replicas", "32", "--num-groups", "4",
            "--num-nodes", "2", "--num-gpus", "8", cwd=tmp_path)
    assert r.returncode == 2 and "weight must be non-negative" in r.stderr
