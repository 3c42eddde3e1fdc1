"""etcd backend of the KV interface (etcd v3 JSON gateway over HTTP, no extra Python package).

A transaction reads at one snapshot revision (the first read fixes it), buffers its writes, and
commits with one etcd Txn whose compares check that every key it read still has the
mod_revision it saw (0 for absent keys); if another writer got there first the Txn fails and
transact() runs the function again. Endpoints are tried in turn, so losing one member of a
three-member cluster is invisible to callers.
"""
from __future__ import annotations

import base64
import json
import random
import time
import urllib.error
import urllib.request

from .kv import Conflict, _prefix_end


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _unb64(s: str) -> bytes:
    return base64.b64decode(s)


class EtcdKV:
    def __init__(self, endpoints, timeout: float = 5.0):
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        self.endpoints = [e if e.startswith("http") else f"http://{e}" for e in endpoints]
        if not self.endpoints:
            raise ValueError("etcd backend needs at least one endpoint")
        self.timeout = timeout
        self._i = 0

    def _post(self, path: str, body: dict) -> dict:
        last = None
        for k in range(len(self.endpoints) * 2):
            ep = self.endpoints[(self._i + k) % len(self.endpoints)]
            req = urllib.request.Request(ep + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    self._i = (self._i + k) % len(self.endpoints)
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:
                last = RuntimeError(f"etcd {ep}{path}: HTTP {e.code} {e.read()[:200]!r}")
                if e.code < 500:
                    raise last from None
            except (urllib.error.URLError, OSError) as e:
                last = e
            time.sleep(0.05 * k)
        raise ConnectionError(f"no etcd endpoint answered: {last}")

    def transact(self, fn, retries: int = 100):
        for attempt in range(retries):
            t = _EtcdTxn(self)
            r = fn(t)
            if t.commit():
                return r
            time.sleep(random.random() * 0.005 * (attempt + 1))
        raise Conflict(f"etcd transaction conflicted {retries} times")

    def close(self):
        pass


class _EtcdTxn:
    def __init__(self, kv: EtcdKV):
        self.kv = kv
        self.rev = None
        self.reads: dict[bytes, int] = {}
        self.writes: dict[bytes, bytes | None] = {}

    def _range(self, key: bytes, end: bytes | None = None, limit: int = 0):
        body = {"key": _b64(key)}
        if end is not None:
            body["range_end"] = _b64(end)
        if limit:
            body["limit"] = limit
        if self.rev is not None:
            body["revision"] = self.rev
        r = self.kv._post("/v3/kv/range", body)
        if self.rev is None:
            self.rev = int(r["header"]["revision"])
        return [(_unb64(x["key"]), _unb64(x.get("value", "")), int(x["mod_revision"]))
                for x in r.get("kvs", [])]

    def get(self, k: bytes):
        if k in self.writes:
            return self.writes[k]
        rows = self._range(k)
        self.reads.setdefault(k, rows[0][2] if rows else 0)
        return rows[0][1] if rows else None

    def put(self, k: bytes, v: bytes):
        self.writes[k] = bytes(v)

    def delete(self, k: bytes):
        self.writes[k] = None

    def scan(self, prefix: bytes, start_after: bytes | None = None, limit: int | None = None):
        lo = prefix if start_after is None else start_after + b"\0"
        end = _prefix_end(prefix) or b"\0"
        want = None if limit is None else limit + len(self.writes)
        rows = self._range(lo, end, want or 0)
        merged = {k: v for k, v, rev in rows}
        for k, v, rev in rows:
            self.reads.setdefault(k, rev)
        for k, v in self.writes.items():
            if k >= lo and k.startswith(prefix):
                if v is None:
                    merged.pop(k, None)
                else:
                    merged[k] = v
        out = sorted(merged.items())
        return out if limit is None else out[:limit]

    def commit(self) -> bool:
        if not self.writes:
            return True
        compare = [{"key": _b64(k), "target": "MOD", "result": "EQUAL", "mod_revision": rev}
                   for k, rev in self.reads.items()]
        ops = []
        for k, v in self.writes.items():
            if v is None:
                ops.append({"request_delete_range": {"key": _b64(k)}})
            else:
                ops.append({"request_put": {"key": _b64(k), "value": _b64(v)}})
        r = self.kv._post("/v3/kv/txn", {"compare": compare, "success": ops})
        return bool(r.get("succeeded"))


class EtcdCluster:
    """Three (or n) etcd members on 127.0.0.1 with free ports, for tests and local clusters."""

    def __init__(self, root: str, members: int = 3):
        from .cluster import free_port
        self.root = root
        self.names = [f"e{i + 1}" for i in range(members)]
        self.client_ports = {n: free_port() for n in self.names}
        self.peer_ports = {n: free_port() for n in self.names}
        self.procs: dict = {}

    @property
    def endpoints(self) -> list[str]:
        return [f"http://127.0.0.1:{self.client_ports[n]}" for n in self.names]

    def start_member(self, name: str, state: str = "new"):
        import os
        import subprocess
        initial = ",".join(f"{n}=http://127.0.0.1:{self.peer_ports[n]}" for n in self.names)
        os.makedirs(self.root, exist_ok=True)
        log = open(f"{self.root}/{name}.log", "ab")
        self.procs[name] = subprocess.Popen(
            ["etcd", "--name", name, "--data-dir", f"{self.root}/{name}",
             "--listen-client-urls", f"http://127.0.0.1:{self.client_ports[name]}",
             "--advertise-client-urls", f"http://127.0.0.1:{self.client_ports[name]}",
             "--listen-peer-urls", f"http://127.0.0.1:{self.peer_ports[name]}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_ports[name]}",
             "--initial-cluster", initial, "--initial-cluster-token", "threefs",
             "--initial-cluster-state", state, "--heartbeat-interval", "50",
             "--election-timeout", "500"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def start(self, timeout: float = 30.0) -> "EtcdCluster":
        for n in self.names:
            self.start_member(n)
        kv = EtcdKV(self.endpoints)
        end = time.time() + timeout
        while True:
            try:
                kv.transact(lambda t: t.put(b"__probe", b"1"))
                return self
            except (ConnectionError, RuntimeError):
                if time.time() > end:
                    self.stop()
                    raise TimeoutError("etcd cluster did not come up")
                time.sleep(0.2)

    def kill(self, name: str):
        p = self.procs.pop(name, None)
        if p is not None:
            p.kill()
            p.wait(timeout=10)

    def stop(self):
        for n in list(self.procs):
            p = self.procs.pop(n)
            p.terminate()
            try:
                p.wait(timeout=10)
            except Exception:  # noqa: BLE001
                p.kill()
                p.wait(timeout=10)
