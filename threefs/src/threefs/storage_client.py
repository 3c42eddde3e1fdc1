"""Client side of the storage service: routing-aware chunk reads and writes with retries."""
from __future__ import annotations

import errno
import random
import threading
import time

from . import rpc, shortcircuit
from .routing import Routing

# reads shorter than this go over TCP even from a local replica: for small reads the bytes
# copied are few, and passing and closing a descriptor costs more than sending them
SC_MIN_BYTES = 64 << 10
RETRY_CODES = {"CHAIN_VERSION", "NOT_HEAD", "NOT_SERVING", "RETRY", "NOT_COMMITTED", "NEED_FULL",
               "NOT_SYNCING", "UNAVAILABLE", "INTERNAL"}


def raise_os(e: rpc.RpcError):
    code = getattr(errno, e.code, None)
    if isinstance(code, int):
        raise OSError(code, e.msg or e.code) from None
    raise e


class StorageClient:
    def __init__(self, rpc_client: rpc.Client, mgmtd, deadline_s: float = 60.0,
                 watch: bool = False, zero_copy: bool = True, short_circuit: bool = True):
        self.rpc, self.mgmtd, self.deadline_s = rpc_client, mgmtd, deadline_s
        # zero_copy: replicas send chunk bytes with sendfile and this side checks them against
        # their stored CRC32C (rpc.FileSlice); a mismatch is read again through the verifying
        # path on the same replica, which then repairs its copy from another one
        self.zero_copy = bool(zero_copy)
        # short_circuit: replicas on this host hand over a descriptor of the committed chunk
        # file and the bytes are read here from the page cache (shortcircuit.py); other
        # replicas, and ranges the replica refuses that way, are read over TCP
        self.sc = shortcircuit.Client(rpc_client.secret) if short_circuit else None
        self.routing = Routing()
        self._rlock = threading.Lock()
        self._last_refresh = 0.0
        self.stats = {"retries": 0, "refreshes": 0, "pushes": 0, "crc_retries": 0}
        self._stop = threading.Event()
        self.refresh(force=True)
        if watch:
            threading.Thread(target=self._watch, daemon=True, name="threefs-routing").start()

    def _watch(self):
        """Long-poll mgmtd: new routing arrives as soon as it changes."""
        while not self._stop.is_set():
            try:
                res = self.mgmtd.call("watch_routing", {"version": self.routing.version,
                                                        "timeout": 5.0},
                                      deadline_s=5.0, rpc_timeout=15.0)
            except Exception:  # noqa: BLE001 - mgmtd failing over: poll again shortly
                self._stop.wait(0.2)
                continue
            if "routing" in res:
                with self._rlock:
                    if res["routing"]["version"] >= self.routing.version:
                        self.routing = Routing(res["routing"])
                        self.stats["pushes"] += 1

    def close(self):
        self._stop.set()
        if self.sc is not None:
            self.sc.close()

    def preconnect(self, per_node: int) -> int:
        """Pool per_node connections to every live storage node (see Client(preconnect=))."""
        addrs = sorted(n["addr"] for n in self.routing.raw["nodes"].values()
                       if n.get("type") == "storage" and n.get("alive"))
        opened = 0
        for a in addrs:  # short-circuit first: on this host, those carry the reads
            if self.sc is not None and not self._stop.is_set():
                try:
                    opened += self.sc.preconnect(a, min(per_node, 2))
                except (shortcircuit.Fallback, OSError, ConnectionError):
                    pass  # not on this host (remembered), or down
        for a in addrs:
            if self._stop.is_set():  # the client is closing
                break
            try:
                opened += self.rpc.preconnect(a, per_node)
            except (OSError, ConnectionError):
                pass  # a node that is down: connected on demand later
        return opened

    def refresh(self, force: bool = False):
        with self._rlock:
            if not force and time.time() - self._last_refresh < 0.05:
                return
            raw = self.mgmtd.call("get_routing", deadline_s=self.deadline_s)["routing"]
            self._last_refresh = time.time()
            self.stats["refreshes"] += 1
            if raw["version"] >= self.routing.version:
                self.routing = Routing(raw)

    def _retry(self, what: str, fn):
        end = time.time() + self.deadline_s
        delay, last = 0.02, None
        while True:
            try:
                return fn()
            except rpc.RpcError as e:
                if e.code not in RETRY_CODES:
                    raise_os(e)
                last = e
            except ConnectionError as e:
                if isinstance(e, rpc.AuthError):
                    raise
                last = e
            self.stats["retries"] += 1
            if time.time() > end:
                raise TimeoutError(f"{what}: gave up after {self.deadline_s}s: {last}")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
            try:
                self.refresh()
            except ConnectionError:
                pass

    def _addr(self, tid: int) -> str:
        a = self.routing.addr_of(tid)
        if a is None:  # e.g. a new primary mgmtd has not heard from the node yet
            raise rpc.RpcError("UNAVAILABLE", f"address of target {tid} unknown")
        return a

    def _chain(self, chain_id: int) -> dict:
        c = self.routing.chain(chain_id)
        if c is None:
            raise rpc.RpcError("UNAVAILABLE", f"chain {chain_id} unknown")
        return c

    def write_chunk(self, chain_id: int, cid: bytes, offset: int, data, truncate_to: int = -1):
        def op():
            c = self._chain(chain_id)
            wl = Routing.write_list(c)
            if not wl:
                raise rpc.RpcError("UNAVAILABLE", f"chain {chain_id} has no serving target")
            addr = self.routing.addr_of(wl[0]["id"])
            if addr is None:
                raise rpc.RpcError("UNAVAILABLE", "head address unknown")
            return self.rpc.call(addr, "write", {"chain": chain_id, "chain_ver": c["ver"],
                                                 "chunk": cid.hex(), "offset": offset,
                                                 "truncate_to": truncate_to}, data)[0]
        return self._retry(f"write chunk {cid.hex()}", op)

    def start_write(self, chain_id: int, cid: bytes, offset: int, data):
        """Send a write to the chain head and return its rpc.Pending without waiting for the
        ack (write-behind); None when the head is not known now (then write_chunk)."""
        c = self.routing.chain(chain_id)
        wl = Routing.write_list(c) if c else []
        addr = self.routing.addr_of(wl[0]["id"]) if wl else None
        if addr is None:
            return None
        try:
            return self.rpc.start(addr, "write", {"chain": chain_id, "chain_ver": c["ver"],
                                                  "chunk": cid.hex(), "offset": offset,
                                                  "truncate_to": -1}, data)
        except ConnectionError:
            return None

    def finish_write(self, pending, chain_id: int, cid: bytes, offset: int, data) -> dict:
        """Take the ack of a started write; if it failed in a retryable way (chain change,
        unreachable head, ...), write it again the usual way (write_chunk: retries until the
        deadline). Writing the same bytes twice leaves the same content."""
        try:
            return pending.finish()[0]
        except rpc.RpcError as e:
            if e.code not in RETRY_CODES:
                raise_os(e)
        except ConnectionError as e:
            if isinstance(e, rpc.AuthError):
                raise
        self.stats["retries"] += 1
        return self.write_chunk(chain_id, cid, offset, data)

    def _sc_ok(self, addr) -> bool:
        return self.sc is not None and addr is not None and self.sc.local(addr)

    def _order(self, serving: list, sc: bool = True) -> list:
        """Replicas to try for a read: with sc, those reachable short-circuit first, then the
        others; random within each group, the tail last in its group (it never refuses:
        NOT_COMMITTED comes only from the others)."""
        order = serving[:]
        random.shuffle(order)
        tail = serving[-1]
        if not sc or self.sc is None:
            return [t for t in order if t is not tail] + [tail]
        return sorted(order, key=lambda t: (not self._sc_ok(self.routing.addr_of(t["id"])),
                                            t is tail))

    def _read_replica(self, addr: str, args: dict, into, sc_pending=None):
        """Bytes from one replica: short-circuit when it is local (and the read not small),
        else (or when it refuses that) over TCP with sendfile; bytes that fail their CRC32C are
        read again over the verifying TCP path (the replica repairs its copy). Returns the
        count (into) or bytes."""
        try:
            if sc_pending is not None or (args["length"] >= SC_MIN_BYTES and self._sc_ok(addr)):
                try:
                    p = sc_pending or self.sc.start(addr, args)
                    n, d = p.finish(into)
                    return n if into is not None else bytes(d)
                except shortcircuit.Fallback:
                    pass
            res, d = self.rpc.call(addr, "read", {**args, "zc": self.zero_copy}, into=into)
        except rpc.RpcError as e:
            if e.code != "CHECKSUM":
                raise
            self.stats["crc_retries"] += 1
            res, d = self.rpc.call(addr, "read", args, into=into)
        if into is not None:
            return 0 if d is None else d.nbytes
        return bytes(d) if d is not None else b""

    def read_chunk(self, chain_id: int, cid: bytes, offset: int, length: int, into=None):
        """Committed bytes of a chunk (b'' when it does not exist). With `into` (a writable
        buffer of >= length bytes) the bytes land there and their count is returned."""
        def op():
            c = self._chain(chain_id)
            serving = Routing.serving(c)
            if not serving:
                raise rpc.RpcError("UNAVAILABLE", f"chain {chain_id} has no serving target")
            last = None
            for t in self._order(serving, length >= SC_MIN_BYTES):
                addr = self.routing.addr_of(t["id"])
                if addr is None:
                    continue
                args = {"chain": chain_id, "chain_ver": c["ver"], "chunk": cid.hex(),
                        "offset": offset, "length": length}
                try:
                    return self._read_replica(addr, args, into)
                except rpc.RpcError as e:
                    if e.code not in RETRY_CODES | {"CHECKSUM"}:
                        raise
                    last = e
                    if e.code == "CHAIN_VERSION":
                        raise
                except ConnectionError as e:
                    if isinstance(e, rpc.AuthError):
                        raise
                    last = e
            raise last if last else rpc.RpcError("UNAVAILABLE", "no replica answered")
        return self._retry(f"read chunk {cid.hex()}", op)

    def start_read(self, chain_id: int, cid: bytes, offset: int, length: int):
        """Send a read of committed bytes to one serving replica (a local one short-circuit
        when there is one) and return a handle without waiting (readahead); finish it with
        finish_read. None when no replica is known."""
        c = self.routing.chain(chain_id)
        serving = Routing.serving(c) if c else []
        if not serving:
            return None
        t = self._order(serving)[0] if self.sc is not None else random.choice(serving)
        addr = self.routing.addr_of(t["id"])
        if addr is None:
            return None
        args = {"chain": chain_id, "chain_ver": c["ver"], "chunk": cid.hex(),
                "offset": offset, "length": length}
        try:
            if self._sc_ok(addr):
                try:
                    return self.sc.start(addr, args), length, addr, args
                except shortcircuit.Fallback:
                    pass
            return self.rpc.start(addr, "read", {**args, "zc": self.zero_copy}), length, addr, None
        except ConnectionError:
            return None

    def start_reads(self, items) -> list:
        """start_read for several ranges [(chain, chunk id, offset, length)]: those that a
        local replica serves go short-circuit in one request per node (one round trip for the
        lot), the others as separate TCP reads. One handle (or None) per range, for
        finish_read."""
        if self.sc is None:
            return [self.start_read(*it) for it in items]
        out: list = [None] * len(items)
        groups: dict[str, list[int]] = {}
        for i, (ch, cid, off, n) in enumerate(items):
            c = self.routing.chain(ch)
            serving = Routing.serving(c) if c else []
            local = [a for a in (self.routing.addr_of(t["id"]) for t in serving) if self._sc_ok(a)]
            if not local:
                out[i] = self.start_read(ch, cid, off, n)
                continue
            # the node already picked for this batch when it holds a replica too
            addr = next((a for a in groups if a in local), None) or random.choice(local)
            groups.setdefault(addr, []).append(i)
        for addr, idx in groups.items():
            for k in range(0, len(idx), shortcircuit.MAX_ITEMS):
                part = idx[k:k + shortcircuit.MAX_ITEMS]
                args = []
                for i in part:
                    ch, cid, off, n = items[i]
                    args.append({"chain": ch, "chain_ver": self.routing.chain(ch)["ver"],
                                 "chunk": cid.hex(), "offset": off, "length": n})
                try:
                    ps = self.sc.start_batch(addr, args)
                except (shortcircuit.Fallback, ConnectionError):
                    for i in part:
                        out[i] = self.start_read(*items[i])
                    continue
                for i, p, a in zip(part, ps, args):
                    out[i] = (p, items[i][3], addr, a)
        return out

    def finish_read(self, started, chain_id: int, cid: bytes, offset: int, into) -> int:
        """Receive a started read into `into`; if that replica refused or failed, read again
        the usual way (read_chunk: other replicas, retries). Returns the byte count."""
        pending, length, addr, sc_args = started
        try:
            if sc_args is not None:
                return self._read_replica(addr, sc_args, into, sc_pending=pending)
            _, d = pending.finish(into=into)
            return 0 if d is None else d.nbytes
        except (rpc.RpcError, ConnectionError) as e:
            if isinstance(e, rpc.AuthError) or (isinstance(e, rpc.RpcError)
                                                and e.code not in RETRY_CODES | {"CHECKSUM"}):
                raise
        return self.read_chunk(chain_id, cid, offset, length, into=into)

    def last_chunk(self, chain_id: int, inode: int):
        def op():
            c = self._chain(chain_id)
            t = Routing.serving(c)
            if not t:
                raise rpc.RpcError("UNAVAILABLE", "no serving target")
            return self.rpc.call(self._addr(t[-1]["id"]), "last_chunk",
                                 {"chain": chain_id, "inode": inode})[0]["last"]
        return self._retry("last_chunk", op)

    def remove_inode(self, chain_id: int, inode: int):
        def op():
            c = self._chain(chain_id)
            wl = Routing.write_list(c)
            if not wl:
                raise rpc.RpcError("UNAVAILABLE", "no serving target")
            return self.rpc.call(self._addr(wl[0]["id"]), "remove_inode",
                                 {"chain": chain_id, "chain_ver": c["ver"], "inode": inode})[0]
        return self._retry("remove_inode", op)

    def batch_read(self, reqs, bufs) -> None:
        """reqs: [(chain, chunk id, offset, length)], bufs: matching writable buffers.
        One batch_read RPC per storage node (a random serving replica per chain); items the
        node refuses (not committed, checksum, version) fall back to read_chunk."""
        groups: dict[str, list[int]] = {}
        for i, (ch, cid, off, n) in enumerate(reqs):
            c = self.routing.chain(ch)
            serving = Routing.serving(c) if c else []
            addr = self.routing.addr_of(random.choice(serving)["id"]) if serving else None
            groups.setdefault(addr or "", []).append(i)
        retry = list(groups.pop("", []))
        for addr, idx in groups.items():
            items = []
            for i in idx:
                ch, cid, off, n = reqs[i]
                items.append({"chain": ch, "chain_ver": self.routing.chain(ch)["ver"],
                              "chunk": cid.hex(), "offset": off, "length": n})
            try:
                res, data = self.rpc.call(addr, "batch_read", {"reqs": items})
            except (ConnectionError, rpc.RpcError):
                retry += idx
                continue
            mv = memoryview(data if data is not None else b"").cast("B")
            pos = 0
            for i, r in zip(idx, res["res"]):
                dst = memoryview(bufs[i]).cast("B")
                if "err" in r:
                    retry.append(i)
                    continue
                n = r["n"]
                dst[:n] = mv[pos:pos + n]
                if n < dst.nbytes:
                    dst[n:] = bytes(dst.nbytes - n)
                pos += n
        for i in retry:
            ch, cid, off, n = reqs[i]
            dst = memoryview(bufs[i]).cast("B")
            got = self.read_chunk(ch, cid, off, n, into=dst)
            if got < n:
                dst[got:] = bytes(n - got)
