"""Local clusters on 127.0.0.1: config generation, process start/stop, status.

`threefs cluster up --dir DIR --storage-nodes 3 --replicas 3` writes DIR/conf/*.toml, starts one
process per service (`python -m threefs <service> --config ...`, logs in DIR/logs) and records
everything in DIR/cluster.json, which `threefs cluster down`, `threefs status` and the client CLI
read. LocalCluster is the same machinery as a Python object (used by the tests and the demo).
"""
from __future__ import annotations

import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time

from . import rpc


_given: set[int] = set()


def free_port() -> int:
    """A loopback TCP port, free now, that this process has not handed out before.

    The service binds it later, and a port from bind(0) lies in the kernel's ephemeral range,
    where an outgoing connection may take it as its source port in between (the service then
    dies with EADDRINUSE). So the port is drawn below that range, where connect() never looks.
    """
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    rng = random.SystemRandom()
    for _ in range(200 if lo > 2048 else 0):
        port = rng.randrange(max(1024, lo // 2), lo)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    while True:  # no room below the ephemeral range: take the kernel's pick
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _given:
            _given.add(port)
            return port


def dump_toml(d: dict) -> str:
    """TOML for the flat configs used here (scalars, lists, tables and arrays of tables)."""
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(str(k))} = {val(x)}" for k, x in v.items()) + "}"
        raise TypeError(f"cannot write {type(v).__name__} to TOML")
    lines, tables = [], []
    for k, v in d.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {val(v)}")
    for k, rows in tables:
        for r in rows:
            lines.append(f"\n[[{k}]]")
            lines += [f"{kk} = {val(vv)}" for kk, vv in r.items()]
    return "\n".join(lines) + "\n"


class LocalCluster:
    """A cluster of real processes under `root`.

    kv: None (SQLite files under root), "etcd" (start three etcd members under root) or a spec
    {"backend": "etcd", "endpoints": [...]} of an existing etcd cluster.
    storage_nodes, replicas: chain layout (chains = storage_nodes by default, chain i on nodes
    i, i+1, ... mod n); mgmtd / meta: number of instances; capacity: bytes per target.
    """

    def __init__(self, root: str, storage_nodes: int = 3, replicas: int = 3, chains: int | None = None,
                 mgmtd: int = 1, meta: int = 1, fsync: str = "none", capacity: int = 1 << 40,
                 chunk_size: int = 1 << 20, stripe: int | None = None, kv: dict | None = None,
                 heartbeat_timeout_s: float = 2.0, secret: str | None = None,
                 session_timeout_s: float = 60.0):
        if not 1 <= replicas <= storage_nodes:
            raise ValueError(f"replicas must be in 1..storage_nodes ({storage_nodes}), got {replicas}")
        self.root = os.path.abspath(root)
        self.secret = secret or secrets.token_hex(16)
        self.n, self.replicas = storage_nodes, replicas
        self.nchains = chains or storage_nodes
        self.n_mgmtd, self.n_meta = mgmtd, meta
        self.fsync, self.capacity, self.chunk_size = fsync, capacity, chunk_size
        self.stripe = stripe or self.nchains
        self.kv = kv
        self.hb_timeout = heartbeat_timeout_s
        self.session_timeout = session_timeout_s
        self.procs: dict[str, dict] = {}

    # --- configs -------------------------------------------------------------------------------
    def _write_configs(self):
        os.makedirs(f"{self.root}/conf", exist_ok=True)
        os.makedirs(f"{self.root}/logs", exist_ok=True)
        mgmtd_addrs = [f"127.0.0.1:{free_port()}" for _ in range(self.n_mgmtd)]
        chains, targets = [], {}
        for c in range(self.nchains):
            tids = []
            for k in range(self.replicas):
                node = (c + k) % self.n
                tid = 1000 * (node + 1) + c + 1
                tids.append(tid)
                targets[str(tid)] = f"s{node + 1}"
            chains.append({"id": c + 1, "targets": tids})
        common = {"secret": self.secret, "mgmtd": mgmtd_addrs}
        cfgs = {}
        for i, addr in enumerate(mgmtd_addrs):
            cfgs[f"mgmtd{i + 1}"] = ("mgmtd", {
                "node_id": f"m{i + 1}", "listen": addr, "secret": self.secret,
                "kv": self.kv or {"backend": "sqlite", "path": f"{self.root}/mgmtd.sqlite"},
                "lease_s": 1.5, "heartbeat_timeout_s": self.hb_timeout, "tick_s": 0.1,
                "targets": targets, "chains": chains})
        for i in range(self.n_meta):
            cfgs[f"meta{i + 1}"] = ("meta", {
                "node_id": f"meta{i + 1}", "listen": f"127.0.0.1:{free_port()}", **common,
                "kv": self.kv or {"backend": "sqlite", "path": f"{self.root}/meta.sqlite"},
                "chunk_size": self.chunk_size, "stripe": self.stripe, "heartbeat_s": 0.25,
                "session_timeout_s": self.session_timeout})
        for i in range(self.n):
            nid = f"s{i + 1}"
            tl = [{"id": int(t), "path": f"{self.root}/data/{nid}/t{t}", "capacity": self.capacity}
                  for t, n in targets.items() if n == nid]
            cfgs[nid] = ("storage", {
                "node_id": nid, "listen": f"127.0.0.1:{free_port()}", **common,
                "fsync": self.fsync, "heartbeat_s": 0.25, "targets": tl,
                "short_circuit": True})  # the socket for same-host clients (shortcircuit.py)
        for name, (svc, cfg) in cfgs.items():
            with open(f"{self.root}/conf/{name}.toml", "w") as f:
                f.write(dump_toml(cfg))
            self.procs[name] = {"service": svc, "config": f"{self.root}/conf/{name}.toml",
                                "addr": cfg["listen"], "pid": None}
        self.mgmtd_addrs = mgmtd_addrs
        self.targets, self.chains = targets, chains

    # --- processes -----------------------------------------------------------------------------
    def start_process(self, name: str):
        p = self.procs[name]
        log = open(f"{self.root}/logs/{name}.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", "threefs", p["service"], "--config",
                                 p["config"]], stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log.close()
        p["pid"], p["proc"] = proc.pid, proc
        self._save()

    def kill(self, name: str, sig: int = signal.SIGKILL):
        p = self.procs[name]
        if p.get("pid"):
            try:
                if p.get("proc") is not None:
                    p["proc"].send_signal(sig)  # a no-op once it has exited (its pid may be reused)
                else:
                    os.kill(p["pid"], sig)
            except ProcessLookupError:
                pass
            if p.get("proc") is not None:
                try:
                    p["proc"].wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.kill(p["pid"], signal.SIGKILL)
                    p["proc"].wait(timeout=10)
            p["pid"] = None
            p["proc"] = None
            self._save()

    def restart(self, name: str):
        self.kill(name)
        self.start_process(name)
        rpc.wait_port(self.procs[name]["addr"], 20)

    def _save(self):
        info = {"secret": self.secret, "mgmtd": self.mgmtd_addrs,
                "processes": {k: {kk: vv for kk, vv in v.items() if kk != "proc"}
                              for k, v in self.procs.items()}}
        tmp = f"{self.root}/cluster.json.tmp"
        with open(tmp, "w") as f:
            json.dump(info, f, indent=1)
        os.chmod(tmp, 0o600)
        os.replace(tmp, f"{self.root}/cluster.json")

    def _start_etcd(self):
        from .kv_etcd import EtcdCluster
        ec = EtcdCluster(f"{self.root}/etcd").start()
        for name, proc in ec.procs.items():
            self.procs[f"etcd-{name}"] = {"service": "etcd", "config": None, "pid": proc.pid,
                                         "proc": proc, "addr": f"127.0.0.1:{ec.client_ports[name]}"}
        self.kv = {"backend": "etcd", "endpoints": ec.endpoints}

    def start(self, timeout: float = 60.0) -> "LocalCluster":
        os.makedirs(self.root, exist_ok=True)
        os.makedirs(f"{self.root}/logs", exist_ok=True)
        if self.kv == "etcd":  # three etcd members on loopback hold meta and mgmtd state
            self._start_etcd()
        self._write_configs()
        order = ([k for k in self.procs if k.startswith("mgmtd")] +
                 [k for k in self.procs if self.procs[k]["service"] == "storage"] +
                 [k for k in self.procs if k.startswith("meta")])
        try:
            for name in order:
                self.start_process(name)
                if name.startswith("mgmtd"):
                    rpc.wait_port(self.procs[name]["addr"], 20)
            self.wait_serving(timeout)
            self.wait_meta(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        for name in sorted(self.procs, key=lambda n: self.procs[n]["service"] == "etcd"):
            if self.procs[name].get("pid"):
                self.kill(name, signal.SIGTERM)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # --- queries -------------------------------------------------------------------------------
    def rpc_client(self) -> rpc.Client:
        return rpc.Client(self.secret)

    def status(self) -> dict | None:
        return mgmtd_status(self.mgmtd_addrs, self.secret)

    def wait_serving(self, timeout: float = 60.0, chains=None) -> dict:
        """Wait until every target of every chain (or of `chains`) is serving."""
        end = time.time() + timeout
        st = None
        while time.time() < end:
            self._check_running()
            st = self.status()
            alive = sum(1 for n in (st or {}).get("nodes", {}).values()
                        if n["type"] == "storage" and n["alive"])
            if st and st["chains"] and alive >= self.n_alive_storage() and all(
                    all(t["state"] == "serving" for t in c["targets"])
                    for c in st["chains"] if chains is None or c["id"] in chains):
                return st
            time.sleep(0.1)
        raise TimeoutError(f"chains not all serving after {timeout}s: {st and st['chains']}")

    def _check_running(self):
        """Raise at once, with its log's tail, when a service started here has exited on its own
        (waiting for it to serve would only time out)."""
        for name, p in self.procs.items():
            proc = p.get("proc")
            if p["service"] != "etcd" and proc is not None and proc.poll() is not None:
                try:
                    with open(f"{self.root}/logs/{name}.log", "rb") as f:
                        tail = f.read()[-2000:].decode(errors="replace")
                except OSError as e:
                    tail = f"(no log: {e})"
                raise RuntimeError(f"{name} ({p['service']}, {p['addr']}) exited with status "
                                   f"{proc.returncode}; the end of its log:\n{tail}")

    def wait_meta(self, timeout: float = 30.0):
        end = time.time() + timeout
        while time.time() < end:
            self._check_running()
            st = self.status()
            if st and sum(1 for n in st["nodes"].values()
                          if n["type"] == "meta" and n["alive"]) >= self.n_alive_meta():
                return
            time.sleep(0.1)
        raise TimeoutError("meta services did not register")

    def n_alive_storage(self) -> int:
        return sum(1 for k, p in self.procs.items() if p["service"] == "storage" and p["pid"])

    def n_alive_meta(self) -> int:
        return sum(1 for k, p in self.procs.items() if p["service"] == "meta" and p["pid"])

    def client(self, **kw):
        from .client import Client
        return Client(self.mgmtd_addrs, self.secret, **kw)


def mgmtd_status(addrs, secret) -> dict | None:
    c = rpc.Client(secret, connect_timeout=1.0, timeout=3.0)
    try:
        for a in addrs:
            try:
                res, _ = c.call(a, "status")
            except (ConnectionError, rpc.RpcError):
                continue
            if res.get("primary"):
                return res["routing"]
        return None
    finally:
        c.close()


def load_info(root: str) -> dict:
    with open(os.path.join(root, "cluster.json")) as f:
        return json.load(f)


def down(root: str, timeout: float = 10.0) -> int:
    info = load_info(root)
    pids = [p["pid"] for p in info["processes"].values() if p.get("pid")]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    end = time.time() + timeout
    for pid in pids:
        while time.time() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in info["processes"].values():
        p["pid"] = None
    with open(os.path.join(root, "cluster.json"), "w") as f:
        json.dump(info, f, indent=1)
    return len(pids)
