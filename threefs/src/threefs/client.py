"""threefs client: file objects, pread/pwrite, batched reads and namespace operations.

    c = threefs.Client(["127.0.0.1:9000"], secret="...", uid=1000, gid=1000)
    with c.open("/data/x.bin", "wb") as f:
        f.write(b"...")
    data = c.pread("/data/x.bin", 4096, 0)
Data goes straight between the client and the storage chains (CRAQ); the meta service handles
only the namespace. Every call retries across routing and chain changes until its deadline.
"""
from __future__ import annotations

import errno
import io
import os
import random
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

from . import rpc
from .chunk import chunk_id
from .common import MgmtdClient
from .shortcircuit import MAX_ITEMS as SC_BATCH
from .storage_client import StorageClient, raise_os

_MODES = {"r": ({"read"}, False), "rb": ({"read"}, False),
          "w": ({"write", "create", "trunc"}, False), "wb": ({"write", "create", "trunc"}, False),
          "a": ({"write", "create", "append"}, True), "ab": ({"write", "create", "append"}, True),
          "x": ({"write", "create", "excl"}, False), "xb": ({"write", "create", "excl"}, False),
          "r+": ({"read", "write"}, False), "r+b": ({"read", "write"}, False),
          "rb+": ({"read", "write"}, False), "w+": ({"read", "write", "create", "trunc"}, False),
          "w+b": ({"read", "write", "create", "trunc"}, False),
          "wb+": ({"read", "write", "create", "trunc"}, False)}


def _check_path(name: str, p):
    if not isinstance(p, str):
        raise TypeError(f"{name} must be a str, got {type(p).__name__}")
    if not p.startswith("/") or "\0" in p:
        raise ValueError(f"{name} must be an absolute path without NUL bytes, got {p!r:.80}")


class Client:
    """mgmtd: 'host:port' or a list of them; secret: the cluster secret; uid/gid: the identity
    the meta service checks permission bits against; readahead: how many blocks ahead files
    opened read-only ask for during a sequential read (0 or False: none; see File.readinto);
    zero_copy: replicas send chunk bytes with sendfile, checked here against their stored
    CRC32C instead of a payload MAC (False: MACed payloads, see rpc.py for the trade-off);
    write_window: how many chunk writes File.write keeps in flight (write-behind; 0: each
    write waits for its ack, as pwrite always does; see File.write); preconnect: authenticated
    connections opened to each storage node in the background at construction (0: all on
    demand), so that the first reads and writes, with readahead or write-behind several at a
    time, do not each wait for a connection set-up; short_circuit: replicas on this host hand
    over a read-only descriptor of the committed chunk file (after the same checks as a TCP
    read, over an authenticated Unix-domain socket) and the bytes are read here from the page
    cache, checked against their stored CRC32C (False: every read goes over TCP; see
    shortcircuit.py for why this stays correct under CRAQ)."""

    def __init__(self, mgmtd, secret, uid: int | None = None, gid: int | None = None,
                 gids=(), deadline_s: float = 60.0, io_threads: int = 4,
                 readahead: int = 3, zero_copy: bool = True, write_window: int = 4,
                 preconnect: int = 4, short_circuit: bool = True):
        addrs = [mgmtd] if isinstance(mgmtd, str) else list(mgmtd)
        for a in addrs:
            rpc.parse_addr(a)
        # argument checks first: nothing is started for a client that is refused
        if isinstance(readahead, bool):
            readahead = 3 if readahead else 0
        if not isinstance(readahead, int) or not 0 <= readahead <= 16:
            raise ValueError(f"readahead must be a bool or an int in [0, 16], got {readahead!r}")
        if isinstance(write_window, bool) or not isinstance(write_window, int) \
                or not 0 <= write_window <= 64:
            raise ValueError(f"write_window must be an int in [0, 64], got {write_window!r}")
        if isinstance(preconnect, bool) or not isinstance(preconnect, int) \
                or not 0 <= preconnect <= 16:
            raise ValueError(f"preconnect must be an int in [0, 16], got {preconnect!r}")
        self.readahead, self.write_window = readahead, write_window
        self.rpc = rpc.Client(secret)
        self.mgmtd = MgmtdClient(addrs, self.rpc)
        self.user = {"uid": os.getuid() if uid is None else int(uid),
                     "gid": os.getgid() if gid is None else int(gid), "gids": list(gids)}
        self.storage = StorageClient(self.rpc, self.mgmtd, deadline_s, watch=True,
                                     zero_copy=zero_copy, short_circuit=bool(short_circuit))
        self.deadline_s = deadline_s
        if preconnect:  # in the background: the constructor does not wait for it
            threading.Thread(target=self.storage.preconnect, args=(preconnect,), daemon=True,
                             name="threefs-preconnect").start()
        self._meta_i = random.randrange(1 << 16)
        self._pool = ThreadPoolExecutor(io_threads) if io_threads > 1 else None
        self.max_file_size = None
        # write sessions are leases: a background thread renews those of open files
        self._writers: "weakref.WeakSet[File]" = weakref.WeakSet()
        self._renew_every = None
        self._stop = threading.Event()
        self._renewer = None

    def _track(self, f: "File", timeout: float):
        self._writers.add(f)
        every = max(0.2, timeout / 3)
        self._renew_every = min(self._renew_every or every, every)
        if self._renewer is None:
            self._renewer = threading.Thread(target=self._renew_loop, daemon=True,
                                             name="threefs-renew")
            self._renewer.start()

    def _renew_loop(self):
        while not self._stop.wait(self._renew_every):
            sess = [[f.attrs["id"], f.session] for f in list(self._writers)
                    if not f.closed and f.session]
            if sess:
                try:
                    self._meta("renew", sessions=sess)
                except Exception:  # noqa: BLE001 - retried next period
                    pass

    # --- meta calls with fail-over -----------------------------------------------------------
    def _meta(self, method: str, **args):
        import time
        for k in ("path", "src", "dst"):
            if k in args:
                _check_path(k, args[k])
        end = time.time() + self.deadline_s
        last = None
        while time.time() < end:
            addrs = self.storage.routing.meta_addrs()
            if not addrs:
                self.storage.refresh(force=True)
                addrs = self.storage.routing.meta_addrs()
            for k in range(len(addrs)):
                addr = addrs[(self._meta_i + k) % len(addrs)]
                try:
                    res, _ = self.rpc.call(addr, method, {**args, "user": self.user})
                    self._meta_i = (self._meta_i + k) % max(1, len(addrs))
                    return res
                except rpc.RpcError as e:
                    if e.code in ("UNAVAILABLE", "INTERNAL") and "Timeout" in e.msg:
                        last = e
                        continue
                    raise_os(e)
                except ConnectionError as e:
                    if isinstance(e, rpc.AuthError):
                        raise
                    last = e
            time.sleep(0.1)
            try:
                self.storage.refresh(force=True)
            except ConnectionError as e:
                last = e
        raise TimeoutError(f"no meta service answered {method}: {last}")

    # --- namespace -----------------------------------------------------------------------------
    def stat(self, path: str, follow_symlinks: bool = True) -> dict:
        return self._meta("stat", path=path, follow=follow_symlinks)["attrs"]

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except FileNotFoundError:
            return False

    def listdir(self, path: str = "/", page_size: int = 1000) -> list[str]:
        return [e["name"] for e in self.scandir(path, page_size)]

    def scandir(self, path: str = "/", page_size: int = 1000) -> list[dict]:
        out, after = [], None
        while True:
            r = self._meta("listdir", path=path, start_after=after, limit=page_size)
            out += r["entries"]
            if not r["more"]:
                return out
            after = r["entries"][-1]["name"]

    def mkdir(self, path: str, mode: int = 0o755, chunk_size: int | None = None,
              stripe: int | None = None):
        layout = {k: v for k, v in (("chunk_size", chunk_size), ("stripe", stripe)) if v}
        if chunk_size is not None and not 4096 <= chunk_size <= (4 << 20):
            raise ValueError(f"chunk_size must be in [4096, 4 MiB], got {chunk_size}")
        return self._meta("mkdir", path=path, mode=mode, layout=layout)["attrs"]

    def makedirs(self, path: str, mode: int = 0o755, exist_ok: bool = True):
        cur = ""
        for part in [p for p in path.split("/") if p]:
            cur += "/" + part
            try:
                self.mkdir(cur, mode)
            except FileExistsError:
                if not exist_ok and cur == path.rstrip("/"):
                    raise

    def rmdir(self, path: str):
        self._meta("rmdir", path=path)

    def remove(self, path: str):
        self._meta("unlink", path=path)

    unlink = remove

    def rename(self, src: str, dst: str):
        self._meta("rename", src=src, dst=dst)

    def link(self, src: str, dst: str):
        return self._meta("link", src=src, dst=dst)["attrs"]

    def symlink(self, target: str, path: str):
        return self._meta("symlink", target=target, path=path)["attrs"]

    def readlink(self, path: str) -> str:
        return self._meta("readlink", path=path)["target"]

    def chmod(self, path: str, mode: int):
        return self._meta("setattr", path=path, mode=mode)["attrs"]

    def chown(self, path: str, uid: int, gid: int):
        return self._meta("setattr", path=path, uid=uid, gid=gid)["attrs"]

    def utime(self, path: str, atime: float, mtime: float):
        return self._meta("setattr", path=path, atime=atime, mtime=mtime)["attrs"]

    def truncate(self, path: str, size: int):
        if not isinstance(size, int) or size < 0:
            raise ValueError(f"size must be a non-negative int, got {size!r}")
        return self._meta("setattr", path=path, size=size)["attrs"]

    def statfs(self) -> dict:
        return self._meta("statfs")

    # --- data ------------------------------------------------------------------------------------
    def open(self, path: str, mode: str = "rb", perm: int = 0o644) -> "File":
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {sorted(_MODES)}, got {mode!r}")
        flags, append = _MODES[mode]
        r = self._meta("open", path=path, flags=sorted(flags), mode=perm)
        f = File(self, path, r["attrs"], r["session"], flags, append)
        if r["session"]:
            self._track(f, float(r.get("session_timeout", 60.0)))
        return f

    def _max_size(self) -> int:
        if self.max_file_size is None:
            self.max_file_size = int(self.statfs()["max_file_size"])
        return self.max_file_size

    def _pieces(self, layout: dict, offset: int, length: int):
        cs = layout["chunk_size"]
        chains = layout["chains"]
        pos, end = offset, offset + length
        while pos < end:
            idx, off = divmod(pos, cs)
            n = min(cs - off, end - pos)
            yield idx, chains[idx % len(chains)], off, n, pos - offset
            pos += n

    def _map(self, fn, items):
        if self._pool is None or len(items) <= 1:
            return [fn(*i) for i in items]
        return list(self._pool.map(lambda a: fn(*a), items))

    def _check_write(self, offset: int, n: int):
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        if offset + n > self._max_size():
            raise OSError(errno.EFBIG, f"write past the maximum file size {self._max_size()}")

    def write_at(self, attrs: dict, offset: int, data) -> int:
        mv = memoryview(data).cast("B")
        self._check_write(offset, mv.nbytes)
        items = [(ch, chunk_id(attrs["id"], idx), off, mv[rel:rel + n])
                 for idx, ch, off, n, rel in self._pieces(attrs["layout"], offset, mv.nbytes)]
        self._map(self.storage.write_chunk, items)
        return mv.nbytes

    def read_into(self, attrs: dict, offset: int, buf) -> int:
        """Fill `buf` (writable bytes-like) with bytes [offset, offset+len(buf)) of the chunks,
        straight from the sockets; holes and missing chunks read as zeros."""
        mv = memoryview(buf).cast("B")
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")

        def one(idx, ch, off, n, rel):
            dst = mv[rel:rel + n]
            got = self.storage.read_chunk(ch, chunk_id(attrs["id"], idx), off, n, into=dst)
            if got < n:
                dst[got:] = bytes(n - got)
        self._map(one, list(self._pieces(attrs["layout"], offset, mv.nbytes)))
        return mv.nbytes

    def read_at(self, attrs: dict, offset: int, length: int) -> bytes:
        """Bytes [offset, offset+length) of the chunks (holes and missing chunks read as 0)."""
        if offset < 0 or length < 0:
            raise ValueError(f"offset and length must be >= 0, got {offset}, {length}")
        buf = bytearray(length)
        self.read_into(attrs, offset, buf)
        return bytes(buf)

    def pwrite(self, path_or_file, data, offset: int) -> int:
        if isinstance(path_or_file, File):
            return path_or_file.pwrite(data, offset)
        with self.open(path_or_file, "r+b") as f:
            return f.pwrite(data, offset)

    def pread(self, path_or_file, length: int, offset: int) -> bytes:
        f = path_or_file
        if isinstance(f, File):
            f._drain()
        attrs = f.attrs if isinstance(f, File) else self.stat(f)
        if attrs["type"] != "f":
            raise IsADirectoryError(errno.EISDIR, f"not a regular file: {f}")
        size = f.size if isinstance(f, File) else attrs["size"]
        length = max(0, min(length, size - offset))
        return self.read_at(attrs, offset, length)

    def read_batch(self, requests) -> list[bytes]:
        """requests: [(path or File, offset, length)] -> list of bytes (clamped to file size).
        The chunk pieces of all requests go out as one batch_read RPC per storage node."""
        plan, reqs, bufs, outs = [], [], [], []
        for f, off, n in requests:
            if isinstance(f, File):
                f._drain()
            attrs = f.attrs if isinstance(f, File) else self.stat(f)
            size = f.size if isinstance(f, File) else attrs["size"]
            if off < 0 or n < 0:
                raise ValueError(f"offset and length must be >= 0, got {off}, {n}")
            n = max(0, min(n, size - off))
            out = bytearray(n)
            outs.append(out)
            mv = memoryview(out)
            for idx, ch, coff, k, rel in self._pieces(attrs["layout"], off, n):
                reqs.append((ch, chunk_id(attrs["id"], idx), coff, k))
                bufs.append(mv[rel:rel + k])
        if reqs:
            self.storage.batch_read(reqs, bufs)
        return [bytes(o) for o in outs]

    def close(self):
        self._stop.set()
        self.storage.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self.rpc.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class File(io.RawIOBase):
    """A threefs file: io.RawIOBase with read/readinto/write/seek/tell/truncate/flush/close."""

    def __init__(self, client: Client, path: str, attrs: dict, session, flags, append: bool):
        super().__init__()
        self.client, self.path, self.attrs = client, path, attrs
        self.session, self.flags, self.append = session, set(flags), append
        self.size = attrs["size"]
        self.pos = self.size if append else 0
        self._lock = threading.Lock()
        self._closing = False
        self._wrote = False
        # readahead, oldest first: (file offset, length, chain, chunk id, chunk offset, started)
        self._ra: list = []
        # write-behind, oldest first: (chain, chunk id, chunk offset, bytes, rpc.Pending)
        self._wb: list = []

    @property
    def name(self):
        return self.path

    def readable(self):
        return "read" in self.flags

    def writable(self):
        return "write" in self.flags

    def seekable(self):
        return True

    def _check(self, want: str):
        if self.closed:
            raise ValueError("I/O operation on closed file")
        if want not in self.flags:
            raise io.UnsupportedOperation(f"file not open for {want}ing")

    def readinto(self, b) -> int:
        """Sequential reads of a read-only file overlap with the storage service: after a
        readinto of n bytes, requests for the next `readahead` blocks of n bytes (each within
        one chunk) go out at once, and later readinto calls receive their answers straight
        into their buffers. The
        prefetched bytes are the committed ones when that request reached the replica (as with
        any readahead, a write completed after it may be missed by the next read; a seek drops
        the prefetch; open "r+b", or pass readahead=False to Client, for reads that always
        start when called)."""
        self._check("read")
        self._drain()
        mv = memoryview(b).cast("B")
        n = max(0, min(mv.nbytes, self.size - self.pos))
        ra = self._ra.pop(0) if self._ra else None
        if n and ra is not None and ra[0] == self.pos and ra[1] == n:
            sc = self.client.storage
            got = sc.finish_read(ra[5], ra[2], ra[3], ra[4], mv[:n])
            if got < n:
                mv[got:n] = bytes(n - got)
        else:
            if ra is not None:
                self._drop_readahead(ra)
            if n and self.client.readahead and "write" not in self.flags:
                self._top_up(n)  # this block goes out with the first readahead batch
            ra = self._ra.pop(0) if self._ra else None
            if ra is not None and ra[0] == self.pos and ra[1] == n:
                got = self.client.storage.finish_read(ra[5], ra[2], ra[3], ra[4], mv[:n])
                if got < n:
                    mv[got:n] = bytes(n - got)
            elif n:
                if ra is not None:
                    self._drop_readahead(ra)
                self.client.read_into(self.attrs, self.pos, mv[:n])
        self.pos += n
        if n and self.client.readahead and "write" not in self.flags:
            self._top_up(n)
        return n

    def _top_up(self, n: int):
        """Keep the readahead window filled with blocks of n bytes. Over TCP: `readahead`
        blocks, one request each (on random replicas: several serve at once). Short-circuit:
        batches of b = max(16, 2 x `readahead`) blocks, one request per node each (a descriptor
        per block: no bytes move until they are read), the next one sent when b or fewer
        blocks are left (a window of up to 2b): a long read pays one round trip and one
        request's work on each side per 16 blocks (16 is what one request carries,
        shortcircuit.MAX_ITEMS). A read that finds no prefetched block starts the window at
        its own block, so that this block goes out with the first batch."""
        ra, sc = self.client.readahead, self.client.storage.sc is not None
        b = max(SC_BATCH, 2 * ra) if sc else ra
        if len(self._ra) >= (b + 1 if sc else ra):
            return
        nxt = self._ra[-1][0] + self._ra[-1][1] if self._ra else self.pos
        want = []
        for _ in range(b if sc else ra - len(self._ra)):
            k = min(n, self.size - nxt)
            if k < (64 << 10):
                break
            pieces = list(self.client._pieces(self.attrs["layout"], nxt, k))
            if len(pieces) != 1:
                break
            idx, ch, off, k, _ = pieces[0]
            want.append((nxt, k, ch, chunk_id(self.attrs["id"], idx), off))
            nxt += k
        if not want:
            return
        started = self.client.storage.start_reads([(w[2], w[3], w[4], w[1]) for w in want])
        for i, (w, st) in enumerate(zip(want, started)):
            if st is None:  # the window must stay contiguous: drop the rest
                for later in started[i + 1:]:
                    if later is not None:
                        later[0].cancel()
                break
            self._ra.append((*w, st))

    def _drop_readahead(self, first=None):
        for ra in ([first] if first else []) + self._ra:
            ra[5][0].cancel()
        self._ra = []

    def read(self, size: int = -1) -> bytes:
        self._check("read")
        if size is None or size < 0:
            size = max(0, self.size - self.pos)
        buf = bytearray(max(0, min(size, self.size - self.pos)))
        n = self.readinto(buf)
        return bytes(buf) if n == len(buf) else bytes(buf[:n])

    def readall(self) -> bytes:
        return self.read(-1)

    def write(self, b) -> int:
        """Write at the position, write-behind: up to Client(write_window=) chunk writes stay
        in flight (each sent to its chain head, the ack taken later), so consecutive writes
        overlap with the replication of earlier ones. A write that fails is retried like any
        other (write_chunk); one that fails for good raises from a later write, flush() or
        close() - those three return only when every earlier write was acknowledged by its
        whole chain (pwrite returns only then, always). Writes to the same chunk never overlap
        in flight, and reads, pwrite and truncate on this file wait for the writes first."""
        self._check("write")
        if self.append:
            self.pos = self.size
        if not self.client.write_window:
            n = self.pwrite(b, self.pos)
        else:
            n = self._write_behind(b, self.pos)
        self.pos += n
        return n

    def _write_behind(self, b, offset: int) -> int:
        cl = self.client
        mv = memoryview(b).cast("B")
        cl._check_write(offset, mv.nbytes)
        if not isinstance(b, bytes):  # the caller may reuse its buffer: keep the bytes for retries
            mv = memoryview(bytes(mv))
        for idx, ch, off, n, rel in cl._pieces(self.attrs["layout"], offset, mv.nbytes):
            cid = chunk_id(self.attrs["id"], idx)
            piece = mv[rel:rel + n]
            for w in [w for w in self._wb if w[1] == cid]:  # same chunk: in order
                self._finish_write(w)
            while len(self._wb) >= cl.write_window:
                self._finish_write(self._wb[0])
            p = cl.storage.start_write(ch, cid, off, piece)
            if p is None:
                cl.storage.write_chunk(ch, cid, off, piece)
            else:
                self._wb.append((ch, cid, off, piece, p))
            self.size = max(self.size, offset + rel + n)
            self._wrote = True
        return mv.nbytes

    def _finish_write(self, w):
        self._wb.remove(w)
        ch, cid, off, piece, p = w
        self.client.storage.finish_write(p, ch, cid, off, piece)

    def _drain(self):
        """Wait for every write in flight; raise the first failure after taking them all."""
        err = None
        while self._wb:
            try:
                self._finish_write(self._wb[0])
            except Exception as e:  # noqa: BLE001 - re-raised below
                err = err or e
        if err is not None:
            raise err

    def pwrite(self, data, offset: int) -> int:
        self._check("write")
        self._drain()
        n = self.client.write_at(self.attrs, offset, data)
        self.size = max(self.size, offset + n)
        self._wrote = True
        return n

    def pread(self, length: int, offset: int) -> bytes:
        self._check("read")
        self._drain()
        length = max(0, min(length, self.size - offset))
        return self.client.read_at(self.attrs, offset, length)

    def seek(self, offset: int, whence: int = 0) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        base = {0: 0, 1: self.pos, 2: self.size}.get(whence)
        if base is None:
            raise ValueError(f"whence must be 0, 1 or 2, got {whence}")
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        if self._ra and base + offset != self.pos:  # not sequential: drop it
            self._drop_readahead()
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def truncate(self, size: int | None = None) -> int:
        self._check("write")
        size = self.pos if size is None else size
        self._drain()
        self.flush()
        self.attrs = self.client.truncate(self.path, size)
        self.size = size
        return size

    def flush(self):
        if self.closed or self._closing or "write" not in self.flags:
            return
        self._drain()
        r = self.client._meta("fsync", inode=self.attrs["id"], session=self.session,
                              length_hint=self.size)
        self.size = max(self.size, r["attrs"]["size"])

    fsync = flush

    def close(self):
        if self.closed:
            return
        self._drop_readahead()
        err = None
        try:
            self._drain()
        except Exception as e:  # noqa: BLE001 - the session is closed first, then it is raised
            err = e
        self._closing = True
        try:
            if "write" in self.flags:
                r = self.client._meta("close", inode=self.attrs["id"], session=self.session,
                                      length_hint=self.size, wrote=self._wrote)
                self.size = r["attrs"]["size"]
        finally:
            super().close()
        if err is not None:
            raise err
