"""A compact, authenticated request/response protocol over TCP.

Connection set-up (mutual challenge-response on the cluster secret):
    client -> server   b"3FSH" | offered flags (1) | client nonce (16)
    server -> client   b"3FSH" | chosen flags (1) | server nonce (16) | HMAC(secret, "srv" + t) (32)
    client -> server   HMAC(secret, "cli" + t)                                            (32)
    with t = offered + chosen + cn + sn; session key = HMAC(secret, "key" + t)
Payload MAC, chosen by the server from what both sides offer (the choice is covered by the
handshake proofs, so it cannot be downgraded unnoticed):
  flag 2 (default with `cryptography`): AES-128-GMAC, i.e. AES-GCM with an empty plaintext and
    the payload as associated data, under the key HMAC(session key, "gmac")[:16] and the nonce
    kind + sequence number from the frame header (unique per key: each direction counts its
    own frames); about 0.06 ms per MiB with AES-NI/PCLMUL;
  flag 1: Poly1305 under a one-time key HMAC(session key, "otk" + frame header) (~0.2 ms/MiB);
  neither: HMAC-SHA256 over the payload bytes (~0.75 ms/MiB).
The frame MAC covers header + meta + the payload tag (or the payload itself for flag 0).
A peer without the secret never gets past this step: the server closes the connection.

Frame (both directions):
    header  ">2sBBQII": magic b"3F", version 1, kind (0 request, 1 response, 2 response with a
            checksummed payload, 3 request with a checksummed payload), sequence number, meta
            length, data length                                                      (20 bytes)
    mac     HMAC-SHA256(session key, header + meta + data or its tag), first 16 bytes (16 bytes)
    meta    UTF-8 JSON object (method and arguments, or the result / error)
    data    raw bytes (chunk payloads), sent and received without re-packing: the sender hands
            the buffers to sendmsg, the receiver reads into one preallocated buffer.
Kind 2 (zero-copy chunk reads, see FileSlice): the payload goes from a chunk file into the socket
with sendfile, so the sender never has it in memory to MAC. The frame MAC then covers header +
meta only, and the meta carries the payload's stored CRC32C ("_crc", the whole payload, or
"_bcrc", hex of a little-endian u32 per 4 KiB block), which the receiver checks over what it
received: corruption on the sender's disk or in transit is detected (answered as error CHECKSUM,
so the caller reads again through the verifying path). A CRC is not a MAC: a deliberate on-path
modifier who also fixes the CRC would go unnoticed for these payloads (the header, the meta and
the payloads of kinds 0 and 1 stay MACed); clients that need that pass zero_copy=False.
Kind 3 (requests whose sender already knows the payload's CRC32C: the CRAQ forward of a
full-chunk write from one replica to its successor): the same trade-off the other way round. The
meta carries "_pcrc" (CRC32C of the payload) and the frame MAC covers header + meta; the receiver
checks the CRC over the received payload and closes the connection on a mismatch, as for a bad
MAC. The sender spends nothing (the head computed the CRC for the chunk metadata, a middle
replica received it), the receiver one CRC pass (~0.02 ms per MiB) instead of a GMAC pass
(~0.055 ms per MiB) on each side. A peer without the cluster secret still cannot send or alter
such a frame's header or meta (the handshake and the frame MAC stop it); what is lost is only
protection against a deliberate on-path modifier who changes the payload of an authenticated
connection in a CRC-preserving way. Storage nodes send kind 3 unless their config sets
fwd_payload_mac = true; client requests always carry the payload MAC.
Sequence numbers count frames per direction, so a replayed or reordered frame fails the check.
The decoder rejects bad magic, version or kind, lengths over the limits, a wrong sequence number,
a bad MAC, truncated frames and meta that is not a JSON object, by closing the connection.
"""
from __future__ import annotations

import array
import functools
import hashlib
import hmac
import json
import os
import socket
import struct
import threading
import time

from . import _C

HEADER = struct.Struct(">2sBBQII")
MAC_LEN = 16
MAX_META = 1 << 20
MAX_DATA = 64 << 20
MAX_FDS = 16  # descriptors passed with one frame (short-circuit reads)
HELLO = b"3FSH"
FLAG_POLY1305 = 1
FLAG_GMAC = 2
try:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.poly1305 import Poly1305
    LOCAL_FLAGS = FLAG_POLY1305 | FLAG_GMAC
except ImportError:  # optional: without it payloads are MACed with HMAC-SHA256
    Poly1305 = AESGCM = None
    LOCAL_FLAGS = 0
SOCK_BUF = 4 << 20  # socket buffers that hold a whole 1 MiB frame and then some


def choose_flags(offered: int, local: int) -> int:
    """The payload MAC both ends support: AES-GMAC over Poly1305 over HMAC-SHA256 (flag 0)."""
    both = offered & local
    return FLAG_GMAC if both & FLAG_GMAC else both & FLAG_POLY1305


@functools.lru_cache(maxsize=4096)
def _gmac_for(key: bytes):
    return AESGCM(hmac.digest(key, b"gmac", "sha256")[:16])


class FileSlice:
    """A response payload sent from a file with sendfile (frame kind 2): n bytes of descriptor fd
    at offset, whose CRC32C is crc (whole payload) or block_crcs (bytes, a little-endian u32 per
    4 KiB block); close() runs once the frame is sent (or failed)."""

    def __init__(self, fd: int, offset: int, n: int, crc: int | None = None,
                 block_crcs: bytes | None = None, close=None):
        if (crc is None) == (block_crcs is None):
            raise ValueError("FileSlice needs exactly one of crc and block_crcs")
        self.fd, self.offset, self.n = fd, offset, n
        self.crc, self.block_crcs, self._close = crc, block_crcs, close

    def close(self):
        c, self._close = self._close, None
        if c is not None:
            c()


class ProtocolError(Exception):
    """A malformed, truncated or unauthenticated frame."""


class AuthError(ConnectionError):
    """The peer does not know the cluster secret."""


class RpcError(Exception):
    """An error answered by the remote handler: code (e.g. 'ENOENT', 'CHAIN_VERSION') and text."""

    def __init__(self, code: str, msg: str = "", **extra):
        super().__init__(f"{code}: {msg}" if msg else code)
        self.code, self.msg, self.extra = code, msg, extra


def _mac(key: bytes, header: bytes, meta: bytes, data_parts, flags: int = 0) -> bytes:
    if not data_parts:  # one-shot HMAC (C fast path) over header + meta
        return hmac.digest(key, bytes(header) + bytes(meta), "sha256")[:MAC_LEN]
    if flags & FLAG_GMAC:
        # AES-128-GMAC (GCM with the payload as associated data) under a per-connection key;
        # the nonce is the header's kind + sequence number, so it never repeats for one key
        data = data_parts[0] if len(data_parts) == 1 else b"".join(data_parts)
        tag = _gmac_for(key).encrypt(header[3:12] + b"\0\0\0", b"", data)
        return hmac.digest(key, bytes(header) + bytes(meta) + tag, "sha256")[:MAC_LEN]
    h = hmac.new(key, header, hashlib.sha256)
    h.update(meta)
    if flags & FLAG_POLY1305:
        p = Poly1305(hmac.digest(key, b"otk" + header, "sha256"))
        for part in data_parts:
            p.update(part)
        h.update(p.finalize())
    else:
        for part in data_parts:
            h.update(part)
    return h.digest()[:MAC_LEN]


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        r = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
        if r == 0:
            raise ProtocolError(f"connection closed after {got} of {n} bytes (truncated frame)")
        got += r
    return buf


def _recv_exact_fds(sock: socket.socket, n: int, fds: list) -> bytearray:
    """As _recv_exact on an AF_UNIX socket, appending descriptors passed along (SCM_RIGHTS)
    to `fds`: they arrive with the first bytes of the frame that carries them."""
    buf, got = bytearray(n), 0
    space = socket.CMSG_SPACE(4 * MAX_FDS)
    while got < n:
        d, anc, flags, _ = sock.recvmsg(n - got, space)
        for level, typ, cdata in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(cdata[:len(cdata) - len(cdata) % a.itemsize])
                fds.extend(a)
        if flags & socket.MSG_CTRUNC:
            raise ProtocolError("descriptors truncated")
        if not d:
            raise ProtocolError(f"connection closed after {got} of {n} bytes (truncated frame)")
        buf[got:got + len(d)] = d
        got += len(d)
    return buf


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, view.nbytes
    while got < n:
        r = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)  # one syscall per frame
        if r == 0:
            raise ProtocolError(f"connection closed after {got} of {n} bytes (truncated frame)")
        got += r


def tune_socket(s: socket.socket) -> None:
    """No Nagle delay; send/receive buffers large enough for a 1 MiB payload in one go."""
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            s.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF)
        except OSError:
            pass


_TIMEVAL = struct.Struct("@ll")


def set_io_timeout(sock: socket.socket, t: float | None) -> None:
    """Blocking socket whose sends and receives time out after t seconds (None: never), through
    the kernel (SO_SNDTIMEO / SO_RCVTIMEO). socket.settimeout would make the descriptor
    non-blocking and poll() before every call (and its every change is an ioctl): here a
    MSG_WAITALL receive of a whole payload is one system call. A call that times out raises
    OSError (EAGAIN, BlockingIOError)."""
    sock.settimeout(None)
    tv = _TIMEVAL.pack(int(t), int((t - int(t)) * 1e6)) if t else _TIMEVAL.pack(0, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _secret_bytes(secret) -> bytes:
    if isinstance(secret, str):
        secret = secret.encode()
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < 8:
        raise ValueError("cluster secret must be str/bytes of at least 8 bytes, got "
                         f"{type(secret).__name__} of length {len(secret) if secret else 0}")
    return bytes(secret)


class Channel:
    """One authenticated TCP connection: send/receive frames with MACs and sequence numbers."""

    def __init__(self, sock: socket.socket, key: bytes, flags: int = 0):
        self.sock, self.key, self.flags = sock, key, flags
        self.send_seq = 0
        self.recv_seq = 0
        self._rbuf = None  # reused receive buffer (see recv(reuse=True))
        self._timeout = -1.0  # what set_timeout last set (-1: not yet)

    def set_timeout(self, t: float | None) -> None:
        """set_io_timeout on this channel's socket, only when t changes (no system call per
        request)."""
        if t != self._timeout:
            set_io_timeout(self.sock, t)
            self._timeout = t

    def send(self, kind: int, meta: dict, data=None, fds=None, crc: int | None = None) -> None:
        """fds: descriptors passed along with the frame (SCM_RIGHTS; AF_UNIX sockets only).
        crc: the payload's CRC32C, known to the caller: a request (kind 0) with a payload then
        goes as kind 3, covered by that CRC instead of the payload MAC (see the module doc)."""
        if isinstance(data, FileSlice):
            try:
                return self._send_file(meta, data)
            finally:
                data.close()
        parts = [] if data is None else (list(data) if isinstance(data, (list, tuple)) else [data])
        parts = [m for m in (memoryview(p).cast("B") for p in parts) if m.nbytes]
        if crc is not None and parts:
            if kind != 0:
                raise ValueError(f"crc= is for requests (kind 0), got kind {kind}")
            kind, meta = 3, {**meta, "_pcrc": int(crc)}
        mb = json.dumps(meta, separators=(",", ":")).encode()
        dlen = sum(p.nbytes for p in parts)
        hdr = HEADER.pack(b"3F", 1, kind, self.send_seq, len(mb), dlen)
        self.send_seq += 1
        bufs = [hdr, _mac(self.key, hdr, mb, parts if kind != 3 else [], self.flags), mb, *parts]
        total = sum(memoryview(b).nbytes for b in bufs)
        if fds:
            sent = self.sock.sendmsg(bufs, [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                             array.array("i", fds))])
        else:
            sent = self.sock.sendmsg(bufs)
        if sent < total:  # partial send: finish the rest
            flat = [memoryview(b).cast("B") for b in bufs]
            for b in flat:
                if sent >= b.nbytes:
                    sent -= b.nbytes
                    continue
                self.sock.sendall(b[sent:])
                sent = 0

    def _send_file(self, meta: dict, fs: FileSlice) -> None:
        """A kind-2 response: header, MAC and meta (with the payload's CRC32C) with sendmsg,
        then the payload straight from the file with sendfile (no copy through user space)."""
        meta = dict(meta)
        if fs.crc is not None:
            meta["_crc"] = int(fs.crc)
        else:
            meta["_bcrc"] = fs.block_crcs.hex()
        mb = json.dumps(meta, separators=(",", ":")).encode()
        hdr = HEADER.pack(b"3F", 1, 2, self.send_seq, len(mb), fs.n)
        self.send_seq += 1
        head = hdr + _mac(self.key, hdr, mb, [], self.flags) + mb
        sent = self.sock.send(head, socket.MSG_MORE)
        if sent < len(head):
            self.sock.sendall(memoryview(head)[sent:], socket.MSG_MORE)
        off, left, fd = fs.offset, fs.n, self.sock.fileno()
        while left > 0:
            r = os.sendfile(fd, fs.fd, off, left)
            if r == 0:
                raise ProtocolError(f"chunk file ended {left} bytes early")
            off += r
            left -= r

    def recv(self, kind: int, into=None, reuse: bool = False, fds: list | None = None):
        """(meta dict, data). With `into` (a writable memoryview), data that fits is read
        straight into it and returned as a memoryview of it. With `reuse`, data lands in a
        buffer owned by the channel and valid until the next recv (no allocation and page
        faults per frame; the server uses it, as a request is handled before the next one).
        With `fds` (a list; AF_UNIX sockets), descriptors passed with the frame are appended
        to it: the caller owns (and closes) them, also when this raises."""
        if fds is None:
            hdr = bytes(_recv_exact(self.sock, HEADER.size + MAC_LEN))
        else:
            hdr = bytes(_recv_exact_fds(self.sock, HEADER.size + MAC_LEN, fds))
        k, mlen, dlen = self._check_header(hdr, kind)
        meta = _recv_exact(self.sock, mlen)
        return self._finish(hdr, k, meta, self._recv_data(dlen, into, reuse), dlen)

    def recv_from(self, hdr: bytes, meta: bytes, have_data: bool):
        """As recv(0, reuse=True) for a request frame whose header and meta were already read
        (by the storage node's C++ data path, _C.FastPath.serve, which hands over every frame it
        does not handle itself), its payload too when have_data (then it is in the reuse
        buffer). Checked exactly as recv checks it."""
        k, mlen, dlen = self._check_header(hdr, 0)
        if len(meta) != mlen:
            raise ProtocolError("meta length does not match the header")
        if have_data:
            data = self._rbuf[:dlen] if dlen else None
        else:
            data = self._recv_data(dlen, None, True)
        return self._finish(hdr, k, meta, data, dlen)

    def reuse_buffer(self, n: int = 1 << 20) -> memoryview:
        """The channel's receive buffer (see recv(reuse=True)), at least n bytes."""
        if self._rbuf is None or self._rbuf.nbytes < n:
            self._rbuf = memoryview(bytearray(max(n, 1 << 20)))
        return self._rbuf

    def _check_header(self, hdr: bytes, kind: int):
        magic, ver, k, seq, mlen, dlen = HEADER.unpack_from(hdr)
        if magic != b"3F" or ver != 1:
            raise ProtocolError(f"bad magic/version {magic!r}/{ver}")
        if k != kind and not (kind == 1 and k == 2) and not (kind == 0 and k == 3):
            raise ProtocolError(f"unexpected frame kind {k}")
        if mlen > MAX_META or dlen > MAX_DATA:
            raise ProtocolError(f"frame too large: meta {mlen}, data {dlen}")
        if seq != self.recv_seq:
            raise ProtocolError(f"sequence number {seq}, expected {self.recv_seq}")
        return k, mlen, dlen

    def _recv_data(self, dlen: int, into, reuse: bool):
        if dlen and reuse:
            into = self.reuse_buffer(dlen)
        if dlen and into is not None and dlen <= into.nbytes:
            data = into[:dlen]
            _recv_into(self.sock, data)
            return data
        return _recv_exact(self.sock, dlen) if dlen else None

    def _finish(self, hdr: bytes, k: int, meta, data, dlen: int):
        """Check the frame MAC (and a kind-2/3 payload's CRC32C); decode the meta."""
        want = _mac(self.key, hdr[:HEADER.size], meta, [data] if data and k < 2 else [],
                    self.flags)
        if not hmac.compare_digest(want, hdr[HEADER.size:]):
            raise ProtocolError("bad frame MAC")
        self.recv_seq += 1
        try:
            m = json.loads(meta)
        except (ValueError, UnicodeDecodeError) as e:
            raise ProtocolError(f"meta is not JSON: {e}") from None
        if not isinstance(m, dict):
            raise ProtocolError("meta is not a JSON object")
        m.pop("_sums", None)  # set below from the payload itself, never taken from the sender
        if k == 3:  # a request whose payload is covered by the CRC32C in its (MACed) meta
            crc = m.pop("_pcrc", None)
            if not isinstance(crc, int) or not 0 <= crc < 1 << 32:
                raise ProtocolError("kind-3 frame without a valid payload CRC")
            # CRC and 4 KiB block CRCs in one pass: the handler hands them to the chunk engine
            # (ChunkEngine.update(sums=)), which then need not pass over the payload again
            sums = _C.crc32c_sums(data if data is not None else b"")
            if sums[0] != crc:
                raise ProtocolError(f"payload of {dlen} bytes does not match its CRC32C")
            m["_sums"] = sums
        if k == 2:  # payload covered by its stored CRC32C instead of the MAC
            crc, bcrc = m.pop("_crc", None), m.pop("_bcrc", None)
            if (crc is None) == (bcrc is None):
                raise ProtocolError("kind-2 frame needs exactly one of _crc and _bcrc")
            try:
                ok = _C.verify_crc32c(data if data is not None else b"", int(crc or 0),
                                      bytes.fromhex(bcrc) if bcrc else b"")
            except (TypeError, ValueError):
                raise ProtocolError("kind-2 frame without a valid payload CRC") from None
            if not ok:  # the frame itself was sound: the channel stays usable
                m = {"err": "CHECKSUM", "msg": f"payload of {dlen} bytes does not match its "
                     "stored CRC32C (corrupted on disk or in transit)"}
        return m, data

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def client_handshake(sock: socket.socket, secret: bytes, flags: int = LOCAL_FLAGS):
    """Returns (session key, chosen flags)."""
    cn = os.urandom(16)
    sock.sendall(HELLO + bytes([flags]) + cn)
    try:
        r = bytes(_recv_exact(sock, 4 + 1 + 16 + 32))
    except ProtocolError:
        raise AuthError("server closed the connection during the handshake") from None
    if r[:4] != HELLO or r[4] & ~flags or r[4] not in (0, FLAG_POLY1305, FLAG_GMAC):
        raise AuthError("server sent a bad hello")
    chosen, sn, proof = r[4], r[5:21], r[21:]
    t = bytes([flags, chosen]) + cn + sn
    if not hmac.compare_digest(proof, hmac.digest(secret, b"srv" + t, "sha256")):
        raise AuthError("server does not know the cluster secret")
    sock.sendall(hmac.digest(secret, b"cli" + t, "sha256"))
    return hmac.digest(secret, b"key" + t, "sha256"), chosen


def server_handshake(sock: socket.socket, secret: bytes, flags: int = LOCAL_FLAGS):
    """Returns (session key, chosen flags); raises ProtocolError for a failed client."""
    r = bytes(_recv_exact(sock, 4 + 1 + 16))
    if r[:4] != HELLO:
        raise ProtocolError("bad hello")
    offered, cn, sn = r[4], r[5:], os.urandom(16)
    chosen = choose_flags(offered, flags)
    t = bytes([offered, chosen]) + cn + sn
    sock.sendall(HELLO + bytes([chosen]) + sn + hmac.digest(secret, b"srv" + t, "sha256"))
    proof = bytes(_recv_exact(sock, 32))
    if not hmac.compare_digest(proof, hmac.digest(secret, b"cli" + t, "sha256")):
        raise ProtocolError("client failed authentication")
    return hmac.digest(secret, b"key" + t, "sha256"), chosen


def parse_addr(addr) -> tuple[str, int]:
    if isinstance(addr, (tuple, list)):
        return str(addr[0]), int(addr[1])
    if not isinstance(addr, str) or ":" not in addr:
        raise ValueError(f"address must be 'host:port', got {addr!r}")
    host, port = addr.rsplit(":", 1)
    return host, int(port)


class Listener:
    """Base of the servers: `sock` listens (set by _listen), an accept thread hands each connection
    to _serve (after _accepted, a hook), `_conns` (under `_lock`) holds the open ones, and stop()
    closes the listener and shuts every connection down."""

    name = "server"

    def _listen(self, sock: socket.socket, backlog: int):
        sock.listen(backlog)
        self.sock, self._stop, self._conns, self._lock = sock, False, set(), threading.Lock()

    def start(self):
        threading.Thread(target=self._accept_loop, daemon=True, name=f"{self.name}-accept").start()
        return self

    def _accept_loop(self):
        while not self._stop:
            try:
                s, _ = self.sock.accept()
            except OSError:
                return
            self._accepted(s)
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _accepted(self, s: socket.socket):
        pass

    def stop(self):
        self._stop = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        with self._lock:
            for c in list(self._conns):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class Server(Listener):
    """Threaded RPC server. handler(method: str, args: dict, data) -> (dict, data|None).

    The handler raises RpcError for answered errors; anything else becomes 'INTERNAL'.
    """

    def __init__(self, addr: str, secret, handler, name: str = "server", flags: int = LOCAL_FLAGS):
        self.secret = _secret_bytes(secret)
        self.flags = flags
        self.handler, self.name = handler, name
        host, port = parse_addr(addr)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tune_socket(sock)  # accepted sockets inherit the buffer sizes
        sock.bind((host, port))
        self._listen(sock, 256)
        self.addr = f"{host}:{self.sock.getsockname()[1]}"
        self.stats = {"rejected": 0, "requests": 0}
        # a _C.FastPath whose serve() runs each connection's request loop (the storage node's
        # C++ full-chunk write path); None: every frame is received and handled here
        self.fast = None

    def _accepted(self, s: socket.socket):
        tune_socket(s)

    def _serve(self, s: socket.socket):
        with self._lock:
            self._conns.add(s)
        ch = None
        try:
            s.settimeout(10)
            ch = Channel(s, *server_handshake(s, self.secret, self.flags))
            s.settimeout(None)
            fast = self.fast
            while not self._stop:
                try:
                    if fast is None:
                        meta, data = ch.recv(0, reuse=True)
                    else:  # frames the C++ data path does not handle itself come back here
                        st, hdr, mb, have, ch.recv_seq, ch.send_seq, err = fast.serve(
                            s.fileno(), ch.key, ch.flags, ch.recv_seq, ch.send_seq,
                            ch.reuse_buffer())
                        if st == 1:
                            return
                        if st == 2:
                            raise ProtocolError(err)
                        if st == 3:
                            raise OSError(err)
                        meta, data = ch.recv_from(hdr, mb, have)
                except ProtocolError as e:
                    if "closed after 0 of" not in str(e):
                        self.stats["rejected"] += 1
                    return
                method = meta.get("m")
                self.stats["requests"] += 1
                try:
                    if not isinstance(method, str):
                        raise RpcError("EINVAL", "request has no method name")
                    res, rdata = self.handler(method, meta, data)
                    res = dict(res or {})
                except RpcError as e:
                    res, rdata = {"err": e.code, "msg": e.msg, **e.extra}, None
                except OSError as e:
                    import errno as _errno
                    res, rdata = {"err": _errno.errorcode.get(e.errno, "EIO"), "msg": str(e)}, None
                except Exception as e:  # noqa: BLE001 - answered, the server keeps serving
                    res, rdata = {"err": "INTERNAL", "msg": f"{type(e).__name__}: {e}"}, None
                ch.send(1, res, rdata)
        except ProtocolError:
            self.stats["rejected"] += 1
        except (OSError, ValueError):
            pass
        finally:
            with self._lock:
                self._conns.discard(s)
            (ch.close() if ch else s.close())



class Client:
    """Pooled RPC client for one cluster secret: call(addr, method, args, data)."""

    def __init__(self, secret, connect_timeout: float = 2.0, timeout: float = 10.0,
                 flags: int = LOCAL_FLAGS):
        self.secret = _secret_bytes(secret)
        self.flags = flags
        self.connect_timeout, self.timeout = connect_timeout, timeout
        self._pool: dict[str, list[Channel]] = {}
        self._lock = threading.Lock()

    def _get(self, addr: str) -> Channel:
        with self._lock:
            lst = self._pool.get(addr)
            if lst:
                return lst.pop()
        host, port = parse_addr(addr)
        s = socket.create_connection((host, port), timeout=self.connect_timeout)
        tune_socket(s)
        try:
            key, chosen = client_handshake(s, self.secret, self.flags)
        except BaseException:
            s.close()
            raise
        return Channel(s, key, chosen)

    def _put(self, addr: str, ch: Channel):
        with self._lock:
            lst = self._pool.setdefault(addr, [])
            if len(lst) < 16:
                lst.append(ch)
                return
        ch.close()

    def preconnect(self, addr: str, n: int) -> int:
        """Open authenticated connections to addr until n are pooled (a one-time cost of about
        0.5 ms each here, paid before the first requests need them). Returns how many opened."""
        opened = 0
        while True:
            with self._lock:
                if len(self._pool.get(addr, [])) >= min(n, 16):
                    return opened
            host, port = parse_addr(addr)
            s = socket.create_connection((host, port), timeout=self.connect_timeout)
            tune_socket(s)
            try:
                ch = Channel(s, *client_handshake(s, self.secret, self.flags))
            except BaseException:
                s.close()
                raise
            self._put(addr, ch)
            opened += 1

    def call(self, addr: str, method: str, args: dict | None = None, data=None,
             timeout: float | None = None, into=None, crc: int | None = None):
        """Returns (result dict, data bytearray|None); raises RpcError or ConnectionError.

        into: optional writable buffer for the answer's data (then returned as a memoryview).
        crc: the CRC32C of `data`, to send it as a kind-3 frame (see Channel.send)."""
        meta = {"m": method, **(args or {})}
        ch = self._get(addr)
        try:
            ch.set_timeout(timeout or self.timeout)
            ch.send(0, meta, data, crc=crc)
            res, rdata = ch.recv(1, None if into is None else memoryview(into).cast("B"))
        except (OSError, ProtocolError) as e:
            ch.close()
            if isinstance(e, ConnectionError):
                raise
            raise ConnectionError(f"rpc {method} to {addr} failed: {e}") from None
        self._put(addr, ch)
        if "err" in res:
            extra = {k: v for k, v in res.items() if k not in ("err", "msg")}
            raise RpcError(res["err"], res.get("msg", ""), **extra)
        return res, rdata

    def start(self, addr: str, method: str, args: dict | None = None, data=None,
              timeout: float | None = None, crc: int | None = None) -> "Pending":
        """Send a request now and take the answer later (Pending.finish): the caller overlaps
        the server's work with its own (the client's sequential readahead uses this)."""
        ch = self._get(addr)
        try:
            ch.set_timeout(timeout or self.timeout)
            ch.send(0, {"m": method, **(args or {})}, data, crc=crc)
        except (OSError, ProtocolError) as e:
            ch.close()
            raise ConnectionError(f"rpc {method} to {addr} failed: {e}") from None
        return Pending(self, addr, method, ch)

    def close(self):
        with self._lock:
            for lst in self._pool.values():
                for ch in lst:
                    ch.close()
            self._pool.clear()


class Pending:
    """An answer still to be received on a channel that stays out of the pool until then."""

    def __init__(self, client: Client, addr: str, method: str, ch: Channel):
        self.client, self.addr, self.method, self.ch = client, addr, method, ch

    def finish(self, into=None):
        """(result dict, data) as Client.call returns them; raises RpcError/ConnectionError."""
        ch, self.ch = self.ch, None
        if ch is None:
            raise ConnectionError("answer already taken or cancelled")
        try:
            res, rdata = ch.recv(1, None if into is None else memoryview(into).cast("B"))
        except (OSError, ProtocolError) as e:
            ch.close()
            raise ConnectionError(f"rpc {self.method} to {self.addr} failed: {e}") from None
        self.client._put(self.addr, ch)
        if "err" in res:
            extra = {k: v for k, v in res.items() if k not in ("err", "msg")}
            raise RpcError(res["err"], res.get("msg", ""), **extra)
        return res, rdata

    def cancel(self):
        """Drop the answer: the connection is closed (its frame sequence is then broken)."""
        if self.ch is not None:
            self.ch.close()
            self.ch = None


def wait_port(addr: str, timeout: float = 10.0) -> bool:
    host, port = parse_addr(addr)
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False
