"""Command line: services, local clusters and file commands.

  threefs mgmtd|meta|storage --config FILE.toml
  threefs cluster up --dir DIR [--storage-nodes 3] [--replicas 3] ... | cluster down --dir DIR
  threefs status [--dir DIR]
  threefs [--dir DIR] ls|stat|cat|put|get|cp|rm|mkdir ...
The cluster directory comes from --dir or $THREEFS_CLUSTER.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading


def _serve(kind: str, config: str) -> int:
    from .common import load_config
    cfg = load_config(config)
    if kind == "mgmtd":
        from .mgmtd import Mgmtd as S
    elif kind == "meta":
        from .meta import MetaService as S
    else:
        from .storage import StorageNode as S
    svc = S(cfg).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: done.set())
    signal.signal(signal.SIGINT, lambda *a: done.set())
    done.wait()
    svc.stop()
    return 0


def _cluster_dir(args) -> str:
    d = getattr(args, "dir", None) or os.environ.get("THREEFS_CLUSTER")
    if not d:
        raise SystemExit("threefs: give --dir DIR or set THREEFS_CLUSTER")
    return d


def _client(args):
    from .client import Client
    from .cluster import load_info
    info = load_info(_cluster_dir(args))
    return Client(info["mgmtd"], info["secret"], uid=args.uid, gid=args.gid, deadline_s=30)


def print_status(routing: dict, out=sys.stdout):
    print(f"routing version {routing['version']}  primary mgmtd {routing['primary']}", file=out)
    print("nodes:", file=out)
    for nid, n in sorted(routing["nodes"].items()):
        print(f"  {nid:8s} {n['type']:8s} {n['addr']:22s} {'alive' if n['alive'] else 'DEAD'}",
              file=out)
    print("chains:", file=out)
    for c in routing["chains"]:
        ts = "  ".join(f"{t['id']}@{routing['targets'].get(str(t['id']), '?')}:{t['state']}"
                       for t in c["targets"])
        print(f"  chain {c['id']:3d} v{c['ver']:<4d} {ts}", file=out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="threefs")
    p.add_argument("--dir", help="cluster directory (default $THREEFS_CLUSTER)")
    p.add_argument("--uid", type=int, default=None)
    p.add_argument("--gid", type=int, default=None)
    sub = p.add_subparsers(dest="cmd", required=True)
    for svc in ("mgmtd", "meta", "storage"):
        s = sub.add_parser(svc, help=f"run a {svc} service")
        s.add_argument("--config", required=True)
    c = sub.add_parser("cluster", help="local cluster on 127.0.0.1")
    c.add_argument("action", choices=["up", "down"])
    c.add_argument("--dir", dest="cdir", required=True)
    c.add_argument("--storage-nodes", type=int, default=3)
    c.add_argument("--replicas", type=int, default=3)
    c.add_argument("--chains", type=int, default=None)
    c.add_argument("--mgmtd", type=int, default=1)
    c.add_argument("--meta", type=int, default=1)
    c.add_argument("--fsync", default="none", choices=["none", "data", "full"])
    c.add_argument("--kv", default="sqlite", choices=["sqlite", "etcd"],
                   help="etcd: start three etcd members in DIR for meta and mgmtd state")
    sub.add_parser("status", help="nodes, chains, target states and versions")
    fl = sub.add_parser("faults", help="kill -9 fault campaign on a temporary local cluster")
    fl.add_argument("--rounds", type=int, default=1, help="times each storage node is killed")
    fl.add_argument("--seed", type=int, default=0)
    sub.add_parser("ls").add_argument("path", nargs="?", default="/")
    sub.add_parser("stat").add_argument("path")
    sub.add_parser("cat").add_argument("path")
    sub.add_parser("mkdir").add_argument("path")
    sub.add_parser("rm").add_argument("path")
    for name in ("put", "get", "cp"):
        s = sub.add_parser(name)
        s.add_argument("src")
        s.add_argument("dst")
    a = p.parse_args(argv)

    if a.cmd in ("mgmtd", "meta", "storage"):
        return _serve(a.cmd, a.config)
    if a.cmd == "cluster":
        from .cluster import LocalCluster, down
        if a.action == "down":
            n = down(a.cdir)
            print(f"stopped {n} processes of the cluster in {a.cdir}")
            return 0
        lc = LocalCluster(a.cdir, a.storage_nodes, a.replicas, a.chains, a.mgmtd, a.meta,
                          fsync=a.fsync, kv=None if a.kv == "sqlite" else "etcd").start()
        print(f"threefs cluster up in {lc.root}: mgmtd {','.join(lc.mgmtd_addrs)}")
        print_status(lc.status())
        print(f"use it with:  export THREEFS_CLUSTER={lc.root}; threefs ls /   "
              f"(stop: threefs cluster down --dir {lc.root})")
        return 0
    if a.cmd == "faults":
        import tempfile
        from .cluster import LocalCluster
        from .faults import run_campaign
        with tempfile.TemporaryDirectory(prefix="threefs-faults-") as d:
            with LocalCluster(d, 3, 3, chunk_size=256 * 1024, heartbeat_timeout_s=1.5) as lc:
                print(f"cluster up in {d}; 2 writers + 2 readers; kill -9 of every storage node "
                      f"(head of one chain, middle of another, tail of a third), {a.rounds} round(s)")
                s = run_campaign(lc, nodes=[f"s{i}" for i in (1, 2, 3)] * a.rounds, seed=a.seed)
        print(f"operations: {s['writes_acked']} writes acknowledged, {s['writes_failed']} failed "
              f"(outcome unknown), {s['reads_ok']} reads ok, {s['reads_failed']} failed, "
              f"{s['reads_bad']} returned data never written")
        print(f"faults injected: {s['faults']} (kill -9); restarted targets seen going "
              f"offline -> syncing -> serving: {s['nodes_seen_offline_syncing_serving']} nodes; "
              f"replicas byte-identical: {s['replicas_identical']}")
        print(f"acknowledged writes lost: {s['acked_writes_lost']}  ({s['seconds']} s)")
        return 0 if s["acked_writes_lost"] == 0 and s["replicas_identical"] else 1
    if a.cmd == "status":
        from .cluster import load_info, mgmtd_status
        info = load_info(_cluster_dir(a))
        st = mgmtd_status(info["mgmtd"], info["secret"])
        if st is None:
            print("no primary mgmtd reachable", file=sys.stderr)
            return 1
        print_status(st)
        return 0

    cl = _client(a)
    try:
        if a.cmd == "ls":
            for e in cl.scandir(a.path):
                print(f"{e['type']} {e['name']}")
        elif a.cmd == "stat":
            print(json.dumps(cl.stat(a.path), indent=1))
        elif a.cmd == "cat":
            with cl.open(a.path, "rb") as f:
                while True:
                    b = f.read(1 << 20)
                    if not b:
                        break
                    sys.stdout.buffer.write(b)
        elif a.cmd == "mkdir":
            cl.mkdir(a.path)
        elif a.cmd == "rm":
            cl.remove(a.path)
        elif a.cmd == "put":
            with open(a.src, "rb") as src, cl.open(a.dst, "wb") as dst:
                while b := src.read(4 << 20):
                    dst.write(b)
        elif a.cmd == "get":
            with cl.open(a.src, "rb") as src, open(a.dst, "wb") as dst:
                while b := src.read(4 << 20):
                    dst.write(b)
        elif a.cmd == "cp":
            with cl.open(a.src, "rb") as src, cl.open(a.dst, "wb") as dst:
                while b := src.read(4 << 20):
                    dst.write(b)
    except OSError as e:
        print(f"threefs {a.cmd}: {e}", file=sys.stderr)
        return 1
    finally:
        cl.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
