"""CPU time per MiB read on a local 3-node, 3-replica cluster (where the read path spends).

    python threefs/benchmarks/bench_read_cpu.py [--procs 1,4] [--rounds 4] [--tcp] [--json out.json]

P client processes each write a file of size-mib / P MiB once (untimed), read it once (untimed:
connections up), then read it `rounds` times sequentially (open "rb", 1 MiB readinto, as
bench_io.py's seq-read) between two samples of: the CPU time of the three storage processes
(/proc/<pid>/stat), the clients' own CPU time (os.times) and the machine's CPU counters
(/proc/stat). Reported per MiB read: client, each storage node, their total; the read throughput
of the same minutes. Reads go short-circuit (the default client) unless --tcp.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from bench_io import read_all
from bench_write_cpu import MiB, print_table, run_clients, run_on_cluster  # (same folder: the script's own)


def _worker(args):
    mgmtd, secret, path, per_mib, rounds, barrier_t, sc, ra = args
    import threefs
    kw = {} if ra is None else {"readahead": ra}
    fs = threefs.Client(mgmtd, secret, uid=0, gid=0, io_threads=1, short_circuit=sc, **kw)
    with fs.open(path, "rb") as f:  # untimed: connections set up
        read_all(f)
    while time.time() < barrier_t:
        time.sleep(0.001)
    c0, t = os.times(), time.perf_counter()
    n = 0
    for _ in range(rounds):
        with fs.open(path, "rb") as f:
            n += read_all(f)
    dt, c1 = time.perf_counter() - t, os.times()
    fs.close()
    assert n == rounds * per_mib * MiB, n
    return dt, (c1.user - c0.user) + (c1.system - c0.system)


def measure(cl, procs: int, size_mib: int, rounds: int, sc: bool, ra=None) -> dict:
    per = max(1, size_mib // procs)
    fs = cl.client(uid=0, gid=0)
    blk = os.urandom(MiB)
    for i in range(procs):
        with fs.open(f"/rd{procs}_{i}", "wb") as f:
            for _ in range(per):
                f.write(blk)
    fs.close()
    return run_clients(cl, _worker, procs, "rd", per, rounds, sc, ra)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", default="1,4")
    ap.add_argument("--size-mib", type=int, default=128, help="MiB per round, all clients")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tcp", action="store_true", help="reads over TCP only (no short-circuit)")
    ap.add_argument("--readahead", type=int, default=None, help="Client(readahead=) (default: its own)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from threefs import __version__
    rows = run_on_cluster("rcpu", a.procs, lambda cl, p: measure(cl, p, a.size_mib, a.rounds, not a.tcp, a.readahead))
    print_table(rows, "read", 3)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"version": __version__, "cpus": os.cpu_count(), "tcp": a.tcp,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
