"""CPU time per MiB written on a local 3-node, 3-replica cluster (where the write path spends).

    python threefs/benchmarks/bench_write_cpu.py [--procs 1,4] [--rounds 4] [--json out.json]

P client processes each write a file of size-mib / P MiB once (untimed), then rewrite it `rounds`
times (open "wb", 1 MiB writes, close) between two samples of: the CPU time of the three storage
processes (/proc/<pid>/stat, 10 ms ticks), the clients' own CPU time (os.times) and the
machine's CPU counters (/proc/stat: how much of the two cores was idle). Reported per MiB
written: client, each storage node, their total; the write throughput of the same minutes.
A write path that is CPU-bound shows little idle time; its throughput is then about
(cores x busy share) / total ms per MiB.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time

MiB = 1 << 20


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def _worker(args):
    mgmtd, secret, path, per_mib, rounds, barrier_t = args
    import threefs
    fs = threefs.Client(mgmtd, secret, uid=0, gid=0, io_threads=1)
    buf = os.urandom(MiB)
    with fs.open(path, "wb") as f:  # first write: new chunk files, outside the sample
        for _ in range(per_mib):
            f.write(buf)
    while time.time() < barrier_t:
        time.sleep(0.001)
    c0, t = os.times(), time.perf_counter()
    for _ in range(rounds):
        with fs.open(path, "wb") as f:
            for _ in range(per_mib):
                f.write(buf)
    dt, c1 = time.perf_counter() - t, os.times()
    fs.close()
    return dt, (c1.user - c0.user) + (c1.system - c0.system)


def sample(cl, worker, jobs: list, barrier: float, mib: int) -> dict:
    """Runs `worker` over `jobs` (one client process each; each returns (wall s, CPU s) of its timed
    part, which starts at `barrier`) and samples the storage processes' and the machine's CPU
    counters around it. Per-MiB figures of the `mib` MiB the clients moved in all."""
    pids = [p["pid"] for p in cl.procs.values() if p["service"] == "storage"]
    with mp.get_context("fork").Pool(len(jobs)) as pool:
        r = pool.map_async(worker, jobs)
        while time.time() < barrier:
            time.sleep(0.005)
        s0, m0 = [_proc_cpu(p) for p in pids], _machine()
        res = r.get(timeout=600)
        s1, m1 = [_proc_cpu(p) for p in pids], _machine()
    wall = max(d for d, _ in res)
    storage = [(b - a) * 1e3 / mib for a, b in zip(s0, s1)]
    client = sum(c for _, c in res) * 1e3 / mib
    d = [b - a for a, b in zip(m0, m1)]
    idle = (d[3] + d[4]) / max(1, sum(d))
    return {"mib": mib, "mib_s": mib / wall, "client_ms_per_mib": client,
            "storage_ms_per_mib": storage, "total_ms_per_mib": client + sum(storage),
            "machine_idle": idle, "loadavg": os.getloadavg()[0]}


def print_table(rows: list, moved: str, digits: int) -> None:
    print(f"| procs | MiB {moved} | MiB/s | client ms/MiB | storage ms/MiB (each node) "
          "| total ms/MiB | machine idle |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        st = " / ".join(f"{x:.{digits}f}" for x in r["storage_ms_per_mib"])
        print(f"| {r['procs']} | {r['mib']} | {r['mib_s']:.0f} | {r['client_ms_per_mib']:.{digits}f} "
              f"| {st} | {r['total_ms_per_mib']:.{digits}f} | {100 * r['machine_idle']:.0f}% |")


def run_on_cluster(tag: str, procs: str, measure_one) -> list:
    """measure_one(cluster, P) for each P of the comma list `procs`, on one fresh local 3-node, 3-replica
    cluster in a temporary folder (removed afterwards)."""
    from threefs import LocalCluster
    root = tempfile.mkdtemp(prefix=f"threefs-{tag}-")
    try:
        with LocalCluster(os.path.join(root, "cluster"), 3, 3) as cl:
            return [measure_one(cl, int(p)) for p in procs.split(",")]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_clients(cl, worker, procs: int, name: str, per: int, rounds: int, *extra) -> dict:
    """`procs` client processes of worker(mgmtd, secret, path, per, rounds, barrier, *extra) on the files
    /<name><procs>_<i>, started together at a barrier, sampled as in sample()."""
    barrier = time.time() + 1.0 + 0.4 * procs
    jobs = [(cl.mgmtd_addrs, cl.secret, f"/{name}{procs}_{i}", per, rounds, barrier, *extra) for i in range(procs)]
    return {"procs": procs, **sample(cl, worker, jobs, barrier, procs * per * rounds)}


def measure(cl, procs: int, size_mib: int, rounds: int) -> dict:
    return run_clients(cl, _worker, procs, "cpu", max(1, size_mib // procs), rounds)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", default="1,4")
    ap.add_argument("--size-mib", type=int, default=128, help="MiB per round, all clients")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from threefs import __version__
    rows = run_on_cluster("cpu", a.procs, lambda cl, p: measure(cl, p, a.size_mib, a.rounds))
    print_table(rows, "written", 2)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"version": __version__, "cpus": os.cpu_count(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
