"""Short-circuit local reads: a storage node hands a client on the same host a read-only
descriptor of a committed chunk file, and the client reads the bytes from the page cache itself
(as HDFS short-circuit reads do), instead of receiving them through a TCP socket.

Where: every storage node also listens on the Linux abstract Unix-domain socket
"\\0threefs-sc/<its TCP address>" (no file on disk; scoped to the network namespace). A client
reading from a replica at address A tries that name first; when nothing listens there (another
host, another network namespace, a node with short_circuit = false) it reads over TCP, and
remembers that for a few seconds.

Protocol: the rpc.py handshake (mutual challenge-response on the cluster secret: no secret, no
descriptor) and MACed frames, then requests
    {"m": "sc_hello"}                      -> {"addr": the node's TCP address, "node": id}
    {"m": "sc_read", "items": [{chain, chain_ver, chunk, offset, length}, ...], "rel": [leases]}
        -> {"items": [{"ver", "found", "n", "off", "lease", "_crc" | "_bcrc"} or {"err", "msg"}]}
           + one descriptor (SCM_RIGHTS) per found range, in order
    {"m": "release", "rel": [leases]}      one-way: no answer
One request carries up to 16 ranges (a sequential reader asks for its readahead window at once:
one round trip per several MiB). Each range passes the same checks as a TCP read (chain version,
the target serving, no pending version; a pending one, a range not aligned to 4 KiB blocks or a
damaged header answers SC_FALLBACK and the client reads that range over TCP, where the node
resolves or repairs it).

Why a descriptor is safe under CRAQ: chunk files are copy-on-write. A write never modifies the
committed file: it writes a new file, renamed to ".p" and, on commit, over ".c". The replaced file
goes to the engine's recycling pool, and a pooled file is overwritten only when no read that may
hold it is in progress. Each descriptor handed out holds such a read entry (a lease) until the
client releases it, after it has read and closed the descriptor (releases ride on the next
request of that connection or, when the connection stays idle, a one-way release at most
~20 ms later; a connection that closes releases all of its leases). So the descriptor shows
exactly the committed version of the moment of the request, however many writes follow. The
client checks the bytes against the stored CRC32C (whole chunk or per 4 KiB block) as on the
zero-copy TCP path; a mismatch is read again over TCP, verified and repaired by the node.
"""
from __future__ import annotations

import os
import socket
import threading
import time

from . import _C, rpc

PREFIX = b"\0threefs-sc/"
RETRY_AFTER_S = 5.0  # a node found without a short-circuit socket is tried again after this
RELEASE_AFTER_S = 0.02
MAX_LEASES = 64  # open leases per connection; beyond them reads go over TCP
MAX_ITEMS = rpc.MAX_FDS  # ranges per sc_read request


def sock_name(addr: str) -> bytes:
    """The abstract socket name of the storage node at TCP address `addr`."""
    return PREFIX + addr.encode()


class Fallback(Exception):
    """This read cannot go short-circuit (no local socket, refused range): use TCP."""


# --- server side (in the storage node) ------------------------------------------------------------
class Server(rpc.Listener):
    """Accepts short-circuit connections for `node` (a StorageNode: node.sc_open(args) ->
    (result dict, engine span) and node.addr / node.id)."""

    name = "sc"

    def __init__(self, node, secret):
        self.node, self.secret = node, rpc._secret_bytes(secret)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(sock_name(node.addr))  # OSError (EADDRINUSE) when taken
        self._listen(sock, 64)
        self.stats = {"reads": 0, "rejected": 0, "leases": 0}  # leases: open now

    def _serve(self, s: socket.socket):
        with self._lock:
            self._conns.add(s)
        spans: dict[int, object] = {}  # lease id -> engine span (its read entry)
        next_lease = 0
        try:
            s.settimeout(10)
            ch = rpc.Channel(s, *rpc.server_handshake(s, self.secret, 0))
            s.settimeout(None)
            while not self._stop:
                try:
                    meta, _ = ch.recv(0)
                except rpc.ProtocolError as e:
                    if "closed after 0 of" not in str(e):
                        self.stats["rejected"] += 1
                    return
                rel = meta.get("rel")
                for lid in rel if isinstance(rel, list) else ():
                    sp = spans.pop(lid, None) if isinstance(lid, int) else None
                    if sp is not None:
                        sp.close()
                        self._count(-1)
                m = meta.get("m")
                if m == "release":
                    continue
                fds = []
                try:
                    if m == "sc_hello":
                        res = {"addr": self.node.addr, "node": self.node.id}
                    elif m == "sc_read":
                        items = meta.get("items")
                        if not isinstance(items, list) or not 0 < len(items) <= MAX_ITEMS:
                            raise rpc.RpcError("EINVAL", f"items must be a list of 1.."
                                               f"{MAX_ITEMS} ranges")
                        if len(spans) + len(items) > MAX_LEASES:  # a client that does not release
                            raise rpc.RpcError("SC_FALLBACK", f"{len(spans)} leases open")
                        out = []
                        for it in items:
                            r, sp = self._open(it)
                            if sp is not None:
                                next_lease += 1
                                spans[next_lease] = sp
                                r["lease"] = next_lease
                                fds.append(sp.fd)
                                self.stats["reads"] += 1
                                self._count(1)
                            out.append(r)
                        res = {"items": out}
                    else:
                        raise rpc.RpcError("EINVAL", f"unknown short-circuit method {m!r}")
                except rpc.RpcError as e:
                    res = {"err": e.code, "msg": e.msg, **e.extra}
                ch.send(1, res, fds=fds)
        except rpc.ProtocolError:
            self.stats["rejected"] += 1
        except (OSError, ValueError):
            pass
        finally:
            for sp in spans.values():  # the client is gone: its leases end
                sp.close()
                self._count(-1)
            with self._lock:
                self._conns.discard(s)
            s.close()

    def _open(self, args):
        """(result, span|None) of one range; an error is answered for this range alone."""
        try:
            if not isinstance(args, dict):
                raise rpc.RpcError("EINVAL", "a range must be an object")
            return self.node.sc_open(args)
        except rpc.RpcError as e:
            return {"err": e.code, "msg": e.msg, **e.extra}, None
        except Exception as e:  # noqa: BLE001 - the TCP path decides
            return {"err": "SC_FALLBACK", "msg": f"{type(e).__name__}: {e}"}, None

    def _count(self, d: int):
        with self._lock:
            self.stats["leases"] += d


# --- client side ---------------------------------------------------------------------------------
class _Conn:
    def __init__(self, ch: rpc.Channel):
        self.ch = ch
        self.rel: list[int] = []  # leases whose descriptors are closed, to release
        self.rel_since = 0.0


class Client:
    """Short-circuit reads from the storage nodes of this host (see the module docstring)."""

    def __init__(self, secret, timeout: float = 10.0):
        self.secret = rpc._secret_bytes(secret)
        self.timeout = timeout
        self._pool: dict[str, list[_Conn]] = {}
        self._no_sc: dict[str, float] = {}  # addr -> when to try its socket again
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._flusher = None
        self.stats = {"reads": 0, "requests": 0, "fallbacks": 0, "crc_errors": 0}

    def local(self, addr: str) -> bool:
        """Whether reads from `addr` may go short-circuit (not known to lack a socket)."""
        t = self._no_sc.get(addr)
        return t is None or time.monotonic() >= t

    def _connect(self, addr: str) -> _Conn:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(sock_name(addr))
        except OSError:
            s.close()
            self._no_sc[addr] = time.monotonic() + RETRY_AFTER_S
            raise Fallback(f"no short-circuit socket for {addr}") from None
        try:
            ch = rpc.Channel(s, *rpc.client_handshake(s, self.secret, 0))
            ch.send(0, {"m": "sc_hello"})
            res, _ = ch.recv(1)
        except rpc.AuthError:
            s.close()
            raise
        except (OSError, rpc.ProtocolError) as e:
            s.close()
            raise ConnectionError(f"short-circuit connection to {addr} failed: {e}") from None
        if res.get("addr") != addr:  # not the node we meant: never read from it
            s.close()
            self._no_sc[addr] = time.monotonic() + RETRY_AFTER_S
            raise Fallback(f"short-circuit socket of {addr} answered as {res.get('addr')}")
        # timeouts enforced by the kernel on a blocking socket (rpc.set_io_timeout): one system
        # call per receive instead of Python's poll + receive
        ch.set_timeout(self.timeout)
        self._no_sc.pop(addr, None)
        return _Conn(ch)

    def _get(self, addr: str) -> _Conn:
        with self._lock:
            lst = self._pool.get(addr)
            if lst:
                return lst.pop()
        return self._connect(addr)

    def preconnect(self, addr: str, n: int) -> int:
        """Open connections to addr until n are pooled; raises Fallback when it has no
        short-circuit socket here. Returns how many were opened."""
        opened = 0
        while not self._stop.is_set():
            with self._lock:
                if len(self._pool.get(addr, [])) >= min(n, 8):
                    break
            self._put(addr, self._connect(addr))
            opened += 1
        return opened

    def _put(self, addr: str, c: _Conn):
        with self._lock:
            lst = self._pool.setdefault(addr, [])
            if len(lst) < 8 and not self._stop.is_set():
                lst.append(c)
                if c.rel and self._flusher is None:
                    self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                                     name="threefs-sc-release")
                    self._flusher.start()
                return
        c.ch.close()  # the node releases the leases of a closed connection

    def start_batch(self, addr: str, items: list) -> list:
        """Send one sc_read for several chunk ranges (dicts of chain, chain_ver, chunk,
        offset, length; at most MAX_ITEMS) and return without waiting: one Pending per range,
        each finished (or cancelled) on its own; the answer comes in one frame. Raises
        Fallback (no short-circuit socket for addr: read over TCP), ConnectionError."""
        if not 0 < len(items) <= MAX_ITEMS:
            raise ValueError(f"items must hold 1..{MAX_ITEMS} ranges, got {len(items)}")
        c = self._get(addr)
        try:
            c.ch.send(0, {"m": "sc_read", "items": items, "rel": c.rel})
        except (OSError, rpc.ProtocolError) as e:
            c.ch.close()
            raise ConnectionError(f"short-circuit read from {addr} failed: {e}") from None
        c.rel = []
        self.stats["requests"] += 1
        b = _Batch(self, addr, c, len(items))
        return [Pending(b, i, it.get("chunk")) for i, it in enumerate(items)]

    def start(self, addr: str, args: dict) -> "Pending":
        """start_batch of one range."""
        return self.start_batch(addr, [args])[0]

    def read(self, addr: str, args: dict, into=None):
        """start(addr, args).finish(into)."""
        return self.start(addr, args).finish(into)

    def _done(self, addr: str, c: _Conn, leases: list):
        if leases:
            if not c.rel:
                c.rel_since = time.monotonic()
            c.rel.extend(leases)
        self._put(addr, c)

    def _flush_loop(self):
        """Release the leases of connections that stay idle (one-way frames)."""
        while not self._stop.wait(RELEASE_AFTER_S):
            now, todo = time.monotonic(), []
            with self._lock:
                for addr, lst in self._pool.items():
                    for c in [c for c in lst if c.rel and now - c.rel_since >= RELEASE_AFTER_S]:
                        lst.remove(c)
                        todo.append((addr, c))
            for addr, c in todo:
                try:
                    c.ch.send(0, {"m": "release", "rel": c.rel})
                    c.rel = []
                except OSError:
                    c.ch.close()
                    continue
                self._put(addr, c)

    def close(self):
        self._stop.set()
        with self._lock:
            for lst in self._pool.values():
                for c in lst:
                    c.ch.close()
            self._pool.clear()


class _Batch:
    """One sc_read request of several ranges; its connection returns to the pool (with the
    leases to release) when every range is finished, and is closed when one is cancelled."""

    def __init__(self, client: Client, addr: str, c: _Conn, n: int):
        self.client, self.addr, self.c, self.left = client, addr, c, n
        self.results = None  # [(result, fd)] once received
        self.leases: list[int] = []

    def receive(self, i: int):
        if self.results is None:
            if self.c is None:
                raise ConnectionError("short-circuit read cancelled")
            fds: list[int] = []
            try:
                res, _ = self.c.ch.recv(1, fds=fds)
                items = res.get("items")
                if "err" not in res and (not isinstance(items, list) or len(items) != self.left):
                    raise rpc.ProtocolError("sc_read answer without one result per range")
            except (OSError, rpc.ProtocolError) as e:
                for fd in fds:
                    os.close(fd)
                self.cancel()
                raise ConnectionError(f"short-circuit read from {self.addr} failed: {e}") from None
            if "err" in res:  # the whole request refused (e.g. too many leases)
                items = [res] * self.left
            found = ["err" not in r and bool(r.get("found")) and "lease" in r for r in items]
            if len(fds) != sum(found):  # a descriptor exactly with each found range
                for fd in fds:
                    os.close(fd)
                self.cancel()
                raise ConnectionError(f"short-circuit read from {self.addr}: {len(fds)} "
                                      f"descriptors for {sum(found)} ranges")
            it = iter(fds)
            self.results = [(r, next(it) if f else -1) for r, f in zip(items, found)]
        res, fd = self.results[i]
        if "err" in res:
            self.done(res)
            if res["err"] == "SC_FALLBACK":
                self.client.stats["fallbacks"] += 1
                raise Fallback(res.get("msg", ""))
            raise rpc.RpcError(res["err"], res.get("msg", ""),
                               **{k: v for k, v in res.items() if k not in ("err", "msg")})
        return res, fd

    def done(self, res: dict):
        if isinstance(res.get("lease"), int):
            self.leases.append(res["lease"])
        self.left -= 1
        if self.left == 0 and self.c is not None:
            c, self.c = self.c, None
            self.client._done(self.addr, c, self.leases)

    def cancel(self):
        c, self.c = self.c, None
        if c is not None:
            c.ch.close()  # the node releases the leases of a closed connection
        for _, fd in (self.results or ()):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.results = [({"err": "RETRY", "msg": "cancelled"}, -1)] * max(self.left, 1)


class Pending:
    """One range of a short-circuit read sent and not yet received (Client.start_batch)."""

    def __init__(self, batch: _Batch, i: int, chunk):
        self.batch, self.i, self.chunk = batch, i, chunk
        self.taken = False

    def cancel(self):
        if not self.taken:
            self.taken = True
            self.batch.cancel()

    def receive(self):
        """(result, fd): the answer for this range and its descriptor (-1 when the chunk has
        nothing committed); the caller reads fd, closes it, then calls release(result). Raises
        Fallback (read it over TCP), rpc.RpcError (e.g. CHAIN_VERSION, NOT_SERVING),
        ConnectionError."""
        if self.taken:
            raise ConnectionError("answer already taken or cancelled")
        self.taken = True
        return self.batch.receive(self.i)

    def release(self, res: dict):
        """The descriptor of `res` is closed: its lease may end (released with the next
        request of the connection, or by the idle flush)."""
        self.batch.done(res)

    def finish(self, into=None):
        """(n, data): the committed bytes, data a memoryview of `into` (or of a new buffer),
        n = 0 when the chunk has none. Raises as receive(), and rpc.RpcError CHECKSUM when the
        bytes do not match their stored CRC32C."""
        cl = self.batch.client
        res, fd = self.receive()
        n, ok = 0, True
        try:
            n = int(res.get("n", 0)) if fd >= 0 else 0
            dst = memoryview(into).cast("B") if into is not None else memoryview(bytearray(n))
            if n > dst.nbytes:
                raise rpc.RpcError("EINVAL", f"short-circuit answer of {n} bytes for a buffer of "
                                   f"{dst.nbytes}")
            dst = dst[:n]
            if n:  # read and CRC32C-checked in one pass (GIL released)
                bcrc = res.get("_bcrc")
                ok = _C.read_verify(fd, dst, int(res.get("off", 0)), int(res.get("_crc") or 0),
                                    bytes.fromhex(bcrc) if bcrc else b"")[1]
        finally:
            if fd >= 0:
                os.close(fd)  # closed before its lease is released
            self.release(res)
        if n:
            if not ok:
                cl.stats["crc_errors"] += 1
                raise rpc.RpcError("CHECKSUM", f"short-circuit bytes of chunk {self.chunk} do "
                                   "not match their stored CRC32C")
        cl.stats["reads"] += 1
        return n, dst
