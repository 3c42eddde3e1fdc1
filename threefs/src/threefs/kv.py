"""Transactional key-value interface for metadata, with an embedded SQLite backend.

    kv.transact(fn)  runs fn(txn) in a serializable transaction and returns its result; txn has
                     get(key) -> bytes|None, put(key, value), delete(key),
                     scan(prefix, start_after=None, limit=None) -> [(key, value)] in key order.
Keys and values are bytes. Conflicting transactions are retried (fn may run more than once).
"""
from __future__ import annotations

import sqlite3
import threading
import time


class Conflict(Exception):
    """A transaction lost a race; transact() retries it."""


class SqliteKV:
    def __init__(self, path: str):
        self.path = path
        self._local = threading.local()
        c = self._conn()
        c.execute("CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL)")

    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "c", None)
        if c is None:
            c = sqlite3.connect(self.path, timeout=30, isolation_level=None,
                                check_same_thread=False)
            c.execute("PRAGMA journal_mode=WAL")
            c.execute("PRAGMA synchronous=NORMAL")
            self._local.c = c
        return c

    def transact(self, fn, retries: int = 50):
        c = self._conn()
        for attempt in range(retries):
            try:
                c.execute("BEGIN IMMEDIATE")  # take the write lock now: serializable
            except sqlite3.OperationalError:
                time.sleep(0.01 * (attempt + 1))
                continue
            try:
                r = fn(_SqliteTxn(c))
                c.execute("COMMIT")
                return r
            except BaseException:
                c.execute("ROLLBACK")
                raise
        raise Conflict(f"sqlite transaction did not get the lock after {retries} tries")

    def close(self):
        c = getattr(self._local, "c", None)
        if c is not None:
            c.close()
            self._local.c = None


class _SqliteTxn:
    def __init__(self, c):
        self.c = c

    def get(self, k: bytes):
        r = self.c.execute("SELECT v FROM kv WHERE k=?", (k,)).fetchone()
        return None if r is None else bytes(r[0])

    def put(self, k: bytes, v: bytes):
        self.c.execute("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", (k, v))

    def delete(self, k: bytes):
        self.c.execute("DELETE FROM kv WHERE k=?", (k,))

    def scan(self, prefix: bytes, start_after: bytes | None = None, limit: int | None = None):
        lo = prefix if start_after is None else start_after
        op = ">=" if start_after is None else ">"
        hi = _prefix_end(prefix)
        q = f"SELECT k, v FROM kv WHERE k {op} ?" + (" AND k < ?" if hi else "") + " ORDER BY k"
        args = [lo] + ([hi] if hi else [])
        if limit is not None:
            q += " LIMIT ?"
            args.append(int(limit))
        return [(bytes(k), bytes(v)) for k, v in self.c.execute(q, args)]


def _prefix_end(prefix: bytes) -> bytes | None:
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


def open_kv(spec: dict):
    """spec: {"backend": "sqlite", "path": ...} or {"backend": "etcd", "endpoints": [...]}."""
    b = spec.get("backend", "sqlite")
    if b == "sqlite":
        return SqliteKV(spec["path"])
    if b == "etcd":
        from .kv_etcd import EtcdKV
        return EtcdKV(spec["endpoints"])
    raise ValueError(f"kv backend must be 'sqlite' or 'etcd', got {b!r}")
