"""threefs I/O and metadata benchmark on a local 3-node, 3-replica cluster, beside the local
file system underneath (same workload, plain Python os.pread/os.pwrite) and fio.

    python threefs/benchmarks/bench_io.py [--size-mib 128] [--procs 1,2,4] [--json out.json]

Each threefs client process first writes and reads an 8 MiB scratch file of its own (outside
the timed region, like fio's ramp_time: its connections to the storage nodes are set up and their
TCP windows grown; --no-warm skips it), then waits for the common start.
Workloads (per row, P client processes, each with its own file; reads use readinto):
  seq-write  1 MiB blocks;  seq-read  1 MiB blocks;  rand-read  4 KiB at random offsets;
  meta create / stat / unlink of empty files (1 process).
Reads run twice, interleaved: with short-circuit local reads (column threefs; the storage nodes
are on this host, so every replica hands over chunk-file descriptors) and over TCP only (column
threefs TCP only: what a client on another host gets). --short-circuit on/off runs one of them;
--workloads picks a subset (reads alone write their files once, untimed).
Everything runs on this machine: storage processes, clients and the peers share its CPU cores.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20


# --- workers (run in child processes) -------------------------------------------------------------
WARM_MIB = 8


def read_all(f) -> int:
    """Reads a file object to its end in 1 MiB readinto calls; the bytes read."""
    buf, n = bytearray(MiB), 0
    while True:
        k = f.readinto(buf)
        if not k:
            return n
        n += k


def _tfs_worker(args):
    kind, mgmtd, secret, path, size, nrand, seed, barrier_t, warm, sc = args
    import threefs
    fs = threefs.Client(mgmtd, secret, uid=0, gid=0, io_threads=1, short_circuit=sc)
    buf = os.urandom(MiB)
    if warm:  # ramp-up outside the timed region: connections set up, TCP windows grown
        with fs.open(path + ".warm", "wb") as f:
            for _ in range(WARM_MIB):
                f.write(buf)
        with fs.open(path + ".warm", "rb") as f:
            read_all(f)
    while time.time() < barrier_t:
        time.sleep(0.001)
    t = time.perf_counter()
    if kind == "seq-write":
        with fs.open(path, "wb") as f:  # write-behind: close() returns when all are acked
            for _ in range(0, size, MiB):
                f.write(buf)
        n = size
    elif kind == "seq-read":
        with fs.open(path, "rb") as f:
            n = read_all(f)
    else:
        rng = random.Random(seed)
        with fs.open(path, "rb") as f:
            for _ in range(nrand):
                f.pread(4096, rng.randrange(size // 4096) * 4096)
        n = nrand * 4096
    dt = time.perf_counter() - t
    fs.close()
    return n, dt


def _local_worker(args):
    kind, _, _, path, size, nrand, seed, barrier_t, _, _ = args
    buf = os.urandom(MiB)
    while time.time() < barrier_t:
        time.sleep(0.001)
    t = time.perf_counter()
    if kind == "seq-write":
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for _ in range(0, size, MiB):
            os.write(fd, buf)
        os.close(fd)
        n = size
    elif kind == "seq-read":
        with open(path, "rb", buffering=0) as f:
            n = read_all(f)
    else:
        rng = random.Random(seed)
        fd = os.open(path, os.O_RDONLY)
        for _ in range(nrand):
            os.pread(fd, 4096, rng.randrange(size // 4096) * 4096)
        os.close(fd)
        n = nrand * 4096
    return n, time.perf_counter() - t


def run_parallel(worker, kind, procs, ctx_args, paths, size, nrand, warm=True, sc=True):
    mgmtd, secret = ctx_args
    start = time.time() + 0.5 + 0.3 * procs
    jobs = [(kind, mgmtd, secret, paths[i], size, nrand, i, start, warm, sc)
            for i in range(procs)]
    with mp.get_context("fork").Pool(procs) as pool:
        t = time.perf_counter()
        res = pool.map(worker, jobs)
    total = sum(n for n, _ in res)
    wall = max(dt for _, dt in res)
    return total, wall


def fio(kind, procs, size, directory, nrand, direct=False):
    """fio's bandwidth in MiB/s; direct=False keeps the page cache (as the local-fs column
    and threefs' storage do), direct=True bypasses it (O_DIRECT: the disk itself)."""
    if shutil.which("fio") is None:
        return None
    rw = {"seq-write": "write", "seq-read": "read", "rand-read": "randread"}[kind]
    bs = "4k" if kind == "rand-read" else "1M"
    cmd = ["fio", "--name=b", f"--rw={rw}", f"--bs={bs}", f"--size={size}",
           f"--numjobs={procs}", f"--directory={directory}", "--ioengine=psync",
           "--group_reporting", "--output-format=json", "--end_fsync=0",
           "--invalidate=0", f"--direct={int(direct)}"]
    if kind == "rand-read":
        cmd.append(f"--number_ios={nrand}")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return None
    j = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    side = j["write"] if kind == "seq-write" else j["read"]
    return side["bw_bytes"] / MiB


def meta_bench(fs, local_dir, n):
    def rate(op):
        t = time.perf_counter()
        for i in range(n):
            op(i)
        return n / (time.perf_counter() - t)

    fs.mkdir("/mb")
    out = {"create": rate(lambda i: fs.open(f"/mb/f{i}", "wb").close()),
           "stat": rate(lambda i: fs.stat(f"/mb/f{i}")),
           "unlink": rate(lambda i: fs.remove(f"/mb/f{i}"))}
    d = os.path.join(local_dir, "mb")
    os.makedirs(d, exist_ok=True)
    loc = {"create": rate(lambda i: os.close(os.open(f"{d}/f{i}", os.O_WRONLY | os.O_CREAT, 0o644))),
           "stat": rate(lambda i: os.stat(f"{d}/f{i}")),
           "unlink": rate(lambda i: os.unlink(f"{d}/f{i}"))}
    return out, loc


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=128, help="total MiB per workload")
    ap.add_argument("--procs", default="1,2,4")
    ap.add_argument("--rand-reads", type=int, default=2000, help="4 KiB reads per process")
    ap.add_argument("--meta-ops", type=int, default=1000)
    ap.add_argument("--fsync", default="none", choices=["none", "data", "full"])
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is kept")
    ap.add_argument("--no-warm", action="store_true",
                    help=f"skip each threefs client's {WARM_MIB} MiB ramp-up before the timed region")
    ap.add_argument("--short-circuit", default="both", choices=["both", "on", "off"],
                    help="threefs reads with short-circuit local reads (on), over TCP only (off), "
                         "or both, interleaved (column threefs = on, threefs_tcp = off)")
    ap.add_argument("--workloads", default="seq-write,seq-read,rand-read,meta",
                    help="comma-separated subset of seq-write,seq-read,rand-read,meta")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    wl = set(a.workloads.split(","))
    if not wl <= {"seq-write", "seq-read", "rand-read", "meta"}:
        ap.error(f"--workloads: unknown {sorted(wl - {'seq-write', 'seq-read', 'rand-read', 'meta'})}")
    from threefs import LocalCluster, __version__

    load0 = os.getloadavg()
    root = tempfile.mkdtemp(prefix="threefs-bench-", dir=a.dir)
    rows = []
    try:
        cl = LocalCluster(os.path.join(root, "cluster"), 3, 3, fsync=a.fsync).start()
        local = os.path.join(root, "local")
        os.makedirs(local)
        fs = cl.client(uid=0, gid=0)
        try:
            for p in [int(x) for x in a.procs.split(",")]:
                per = (a.size_mib * MiB) // p // MiB * MiB
                tpaths = [f"/b{p}_{i}" for i in range(p)]
                lpaths = [f"{local}/b{p}_{i}" for i in range(p)]
                if "seq-write" not in wl:  # the read workloads need the files: write them once
                    blk = os.urandom(MiB)
                    for tp, lp in zip(tpaths, lpaths):
                        with fs.open(tp, "wb") as f, open(lp, "wb") as g:
                            for _ in range(per // MiB):
                                f.write(blk)
                                g.write(blk)
                for kind in ("seq-write", "seq-read", "rand-read"):
                    if kind not in wl:
                        continue
                    div = 4096 if kind == "rand-read" else MiB
                    unit = "IOPS" if kind == "rand-read" else "MiB/s"
                    ours_l, tcp_l, peer_l, fio_l, fiod_l = [], [], [], [], []
                    # writes are TCP either way; reads with short-circuit on and/or off
                    both = kind != "seq-write" and a.short_circuit == "both"
                    sc = a.short_circuit != "off" or kind == "seq-write"
                    for _ in range(a.repeat):  # interleaved, so load changes hit all of them
                        n, dt = run_parallel(_tfs_worker, kind, p, (cl.mgmtd_addrs, cl.secret),
                                             tpaths, per, a.rand_reads, warm=not a.no_warm,
                                             sc=sc)
                        if both:
                            tn, tdt = run_parallel(_tfs_worker, kind, p,
                                                   (cl.mgmtd_addrs, cl.secret), tpaths, per,
                                                   a.rand_reads, warm=not a.no_warm, sc=False)
                            tcp_l.append(tn / div / tdt)
                        ln, ldt = run_parallel(_local_worker, kind, p, (None, None), lpaths, per,
                                               a.rand_reads)
                        fdir = os.path.join(root, f"fio{p}")
                        os.makedirs(fdir, exist_ok=True)
                        fv = fio(kind, p, per, fdir, a.rand_reads)
                        fd = fio(kind, p, per, fdir, a.rand_reads, direct=True)
                        if fd is not None:
                            fiod_l.append(fd * MiB / div)
                        ours_l.append(n / div / dt)
                        peer_l.append(ln / div / ldt)
                        if fv is not None:
                            fio_l.append(fv * MiB / div)
                    ours, peer = statistics.median(ours_l), statistics.median(peer_l)
                    tcp = statistics.median(tcp_l) if tcp_l else None
                    fio_v = statistics.median(fio_l) if fio_l else None
                    fiod = statistics.median(fiod_l) if fiod_l else None
                    mode = "tcp" if kind == "seq-write" else a.short_circuit
                    rows.append({"workload": kind, "procs": p, "unit": unit, "threefs": ours,
                                 "short_circuit": mode if mode != "both" else "on",
                                 "threefs_tcp": tcp, "ratio_tcp": tcp / peer if tcp else None,
                                 "local_fs": peer, "fio": fio_v, "fio_direct": fiod,
                                 "ratio": ours / peer,
                                 "ratio_fio_direct": ours / fiod if fiod else None,
                                 "runs": {"threefs": ours_l, "threefs_tcp": tcp_l,
                                          "local_fs": peer_l}})
                    tcp_s = f"  threefs tcp {tcp:9.1f} ({tcp / peer:.3f})" if tcp else ""
                    print(f"{kind:10s} procs={p}  threefs {ours:9.1f} {unit:5s}{tcp_s}  local fs "
                          f"{peer:9.1f}  fio {fio_v if fio_v is None else round(fio_v, 1)}  "
                          f"fio direct {fiod if fiod is None else round(fiod, 1)}  "
                          f"ratio {ours / peer:.3f}", flush=True)
            m, lm = meta_bench(fs, local, a.meta_ops) if "meta" in wl else ({}, {})
            for k in m:
                rows.append({"workload": f"meta-{k}", "procs": 1, "unit": "ops/s",
                             "threefs": m[k], "local_fs": lm[k], "fio": None, "fio_direct": None,
                             "ratio": m[k] / lm[k]})
                print(f"meta-{k:6s} procs=1  threefs {m[k]:9.1f} ops/s  local fs {lm[k]:9.1f}  "
                      f"ratio {m[k] / lm[k]:.4f}", flush=True)
        finally:
            fs.close()
            cl.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n| workload | procs | threefs | threefs TCP only | local fs | fio | fio direct | unit "
          "| threefs / local fs | TCP only / local fs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        f = "-" if r["fio"] is None else f"{r['fio']:.1f}"
        fd = "-" if r["fio_direct"] is None else f"{r['fio_direct']:.1f}"
        t = r.get("threefs_tcp")
        ts, tr = ("-", "-") if t is None else (f"{t:.1f}", f"{r['ratio_tcp']:.3f}")
        print(f"| {r['workload']} | {r['procs']} | {r['threefs']:.1f} | {ts} | {r['local_fs']:.1f} "
              f"| {f} | {fd} | {r['unit']} | {r['ratio']:.3f} | {tr} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"version": __version__, "loadavg_start": load0, "fsync": a.fsync,
                       "warm_mib": 0 if a.no_warm else WARM_MIB,
                       "short_circuit": a.short_circuit,
                       "size_mib": a.size_mib,
                       "repeat": a.repeat, "cpus": os.cpu_count(),
                       "loadavg_end": os.getloadavg(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
