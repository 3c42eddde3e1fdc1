"""Fault campaign: concurrent writers/readers with an acknowledged-write log, while storage
nodes are killed with SIGKILL and restarted in turn.

Every storage node is head of one chain, middle of another and tail of a third (chain i lives
on nodes i, i+1, i+2), so killing each node once kills a head, a middle and a tail replica.
The checker keeps, per block, the checksum of the last acknowledged write plus those of later
writes whose outcome is unknown (they failed or timed out); at the end each block must hold one
of these. A block holding anything else is an acknowledged write lost.
"""
from __future__ import annotations

import hashlib
import random
import signal
import threading
import time

from . import rpc

BLOCK = 64 * 1024


def _h(b: bytes) -> str:
    return hashlib.blake2b(b, digest_size=16).hexdigest()


class Checker:
    def __init__(self, fs, files: int = 2, blocks: int = 24, seed: int = 0):
        self.fs = fs
        # even writers: partial-chunk writes (64 KiB blocks in bigger chunks); odd writers: every
        # write covers a whole 64 KiB chunk (the path that forwards while writing locally)
        self.paths = [f"/faults/w{i}" if i % 2 == 0 else f"/faults/whole/w{i}"
                      for i in range(files)]
        self.blocks = blocks
        self.lock = threading.Lock()
        self.acked: dict = {}      # (path, block) -> hash of the last acknowledged write
        self.unknown: dict = {}    # (path, block) -> hashes of writes with unknown outcome since
        self.written: dict = {}    # (path, block) -> every hash ever attempted
        self.stats = {"writes_acked": 0, "writes_failed": 0, "reads_ok": 0, "reads_failed": 0,
                      "reads_bad": 0}
        self.stop = threading.Event()
        self.seed = seed
        self.handles = {}

    def setup(self):
        self.fs.makedirs("/faults")
        self.fs.mkdir("/faults/whole", chunk_size=BLOCK)
        zero = bytes(BLOCK)
        for p in self.paths:
            f = self.fs.open(p, "wb")
            f.pwrite(zero * self.blocks, 0)
            self.handles[p] = f
            for b in range(self.blocks):
                self.acked[(p, b)] = _h(zero)
                self.written[(p, b)] = {_h(zero)}

    def writer(self, i: int):
        rng = random.Random(self.seed * 100 + i)
        p, f = self.paths[i], self.handles[self.paths[i]]
        seq = 0
        while not self.stop.is_set():
            b = rng.randrange(self.blocks)
            data = (f"{p}:{b}:{seq}:".encode() + rng.randbytes(BLOCK))[:BLOCK]
            seq += 1
            h = _h(data)
            with self.lock:
                self.written[(p, b)].add(h)
            try:
                f.pwrite(data, b * BLOCK)
            except Exception:  # noqa: BLE001 - outcome unknown
                with self.lock:
                    self.unknown.setdefault((p, b), set()).add(h)
                    self.stats["writes_failed"] += 1
                continue
            with self.lock:
                self.acked[(p, b)] = h
                self.unknown.pop((p, b), None)
                self.stats["writes_acked"] += 1

    def reader(self, i: int):
        rng = random.Random(self.seed * 100 + 50 + i)
        while not self.stop.is_set():
            p = rng.choice(self.paths)
            b = rng.randrange(self.blocks)
            try:
                d = self.fs.read_at(self.handles[p].attrs, b * BLOCK, BLOCK)
            except Exception:  # noqa: BLE001
                with self.lock:
                    self.stats["reads_failed"] += 1
                continue
            with self.lock:
                ok = _h(d) in self.written[(p, b)]
                self.stats["reads_ok" if ok else "reads_bad"] += 1

    def verify(self) -> int:
        lost = 0
        for (p, b), h in sorted(self.acked.items()):
            d = self.fs.read_at(self.handles[p].attrs, b * BLOCK, BLOCK)
            if _h(d) != h and _h(d) not in self.unknown.get((p, b), set()):
                lost += 1
        return lost


def replicas_identical(cluster) -> bool:
    """Every chain's targets hold the same chunks (version, size, CRC) and nothing pending."""
    st = cluster.status()
    rc = cluster.rpc_client()
    try:
        for c in st["chains"]:
            views = []
            for t in c["targets"]:
                node = st["targets"][str(t["id"])]
                res, _ = rc.call(st["nodes"][node]["addr"], "meta_list", {"chain": c["id"]})
                views.append(res["chunks"])
            if any(v != views[0] for v in views) or any(x[2] for x in views[0]):
                return False
        return True
    finally:
        rc.close()


def wait_state(cluster, node: str, states, timeout: float = 30.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        st = cluster.status()
        if st:
            mine = [t["state"] for c in st["chains"] for t in c["targets"]
                    if st["targets"][str(t["id"])] == node]
            if mine and all(s in states for s in mine):
                return True
        time.sleep(0.05)
    return False


def run_campaign(cluster, nodes=None, writers: int = 2, readers: int = 2, pause_s: float = 1.0,
                 seed: int = 0, log=print) -> dict:
    """Kill -9 and restart each storage node in turn under load; returns the summary."""
    nodes = nodes or [k for k, p in cluster.procs.items() if p["service"] == "storage"]
    fs = cluster.client(uid=0, gid=0, deadline_s=60)
    ck = Checker(fs, files=writers, seed=seed)
    ck.setup()
    threads = [threading.Thread(target=ck.writer, args=(i,), daemon=True) for i in range(writers)]
    threads += [threading.Thread(target=ck.reader, args=(i,), daemon=True) for i in range(readers)]
    seen: set = set()  # (node, state) pairs observed by polling mgmtd

    def poll():
        while not ck.stop.is_set():
            st = cluster.status()
            if st:
                for c in st["chains"]:
                    for t in c["targets"]:
                        seen.add((st["targets"][str(t["id"])], t["state"]))
            time.sleep(0.02)
    threads.append(threading.Thread(target=poll, daemon=True))
    for t in threads:
        t.start()
    faults, t0 = 0, time.time()
    try:
        for n in nodes:
            time.sleep(pause_s)
            reads_before = ck.stats["reads_ok"]
            cluster.kill(n, signal.SIGKILL)
            faults += 1
            log(f"  killed {n} (kill -9)")
            if not wait_state(cluster, n, ("offline",), 30):
                raise TimeoutError(f"{n} was not marked offline")
            time.sleep(0.3)
            cluster.start_process(n)
            rpc.wait_port(cluster.procs[n]["addr"], 20)
            cluster.wait_serving(60)
            log(f"  restarted {n}: back to serving "
                f"({ck.stats['reads_ok'] - reads_before} reads served meanwhile)")
    finally:
        time.sleep(pause_s)
        ck.stop.set()
        for t in threads:
            t.join(timeout=90)
    lost = ck.verify()
    for f in ck.handles.values():
        f.close()
    identical = replicas_identical(cluster)
    fs.close()
    synced = sum(1 for n in set(nodes) if (n, "syncing") in seen and (n, "offline") in seen)
    return {**ck.stats, "faults": faults, "nodes_seen_offline_syncing_serving": synced,
            "acked_writes_lost": lost, "replicas_identical": identical,
            "seconds": round(time.time() - t0, 1)}
