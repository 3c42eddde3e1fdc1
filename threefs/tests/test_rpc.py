import os
import random
import socket
import struct

import pytest

from threefs import rpc

SECRET = "test-secret-0123"


def handler(method, args, data):
    if method == "echo":
        return {"n": args.get("n"), "len": len(data) if data else 0}, data
    if method == "fail":
        raise rpc.RpcError("ENOENT", "no such thing")
    if method == "boom":
        raise RuntimeError("bug")
    if method == "sums":  # what the handler got as the payload's sums (kind-3 frames only)
        s = args.get("_sums")
        return {"sums": None if s is None else [s[0], s[1].hex()]}, None
    if method == "file":  # a zero-copy answer from a file, with a right or a wrong CRC
        from threefs import _C
        fd = os.open(args["path"], os.O_RDONLY)
        n, off = args["n"], args["off"]
        good = os.pread(fd, n, off)
        if args.get("blocks"):
            crcs = b"".join(_C.crc32c(good[i:i + 4096]).to_bytes(4, "little")
                            for i in range(0, n, 4096))
            return {"n": n}, rpc.FileSlice(fd, off, n, block_crcs=crcs,
                                           close=lambda: os.close(fd))
        crc = _C.crc32c(good) ^ (1 if args.get("lie") else 0)
        return {"n": n}, rpc.FileSlice(fd, off, n, crc=crc, close=lambda: os.close(fd))
    raise rpc.RpcError("EINVAL", f"unknown method {method}")


@pytest.fixture
def server():
    s = rpc.Server("127.0.0.1:0", SECRET, handler).start()
    yield s
    s.stop()


@pytest.mark.parametrize("client_flags", [rpc.LOCAL_FLAGS, rpc.FLAG_POLY1305, 0])
def test_roundtrip_and_errors(server, client_flags):
    c = rpc.Client(SECRET, flags=client_flags)  # GMAC, Poly1305 and HMAC payload MACs
    rng = random.Random(3)
    for n in (0, 1, 4096, 1 << 20, 3 * 1000 * 1000 + 7):
        d = rng.randbytes(n)
        res, back = c.call(server.addr, "echo", {"n": n}, d if n else None)
        assert res == {"n": n, "len": n}
        assert (bytes(back) if back is not None else b"") == d
    # several data parts are sent as one payload
    res, back = c.call(server.addr, "echo", {}, [b"ab", memoryview(b"cde")])
    assert bytes(back) == b"abcde"
    with pytest.raises(rpc.RpcError) as ei:
        c.call(server.addr, "fail")
    assert ei.value.code == "ENOENT"
    with pytest.raises(rpc.RpcError) as ei:
        c.call(server.addr, "boom")
    assert ei.value.code == "INTERNAL"
    c.close()


def test_wrong_or_missing_secret_is_refused(server):
    bad = rpc.Client("another-secret-xx")
    with pytest.raises(rpc.AuthError):
        bad.call(server.addr, "echo", {"n": 1})
    # no handshake at all: a frame sent straight away is rejected and the socket closed
    s = socket.create_connection(rpc.parse_addr(server.addr), timeout=5)
    s.sendall(rpc.HEADER.pack(b"3F", 1, 0, 0, 2, 0) + b"\0" * 16 + b"{}" + b"\0" * 40)
    assert _closed_by_peer(s)
    s.close()
    good = rpc.Client(SECRET)
    assert good.call(server.addr, "echo", {"n": 2})[0]["n"] == 2
    with pytest.raises(ValueError, match="secret"):
        rpc.Client("short")


def _authed_socket(addr):
    s = socket.create_connection(rpc.parse_addr(addr), timeout=5)
    key, flags = rpc.client_handshake(s, SECRET.encode())
    return s, key, flags


def _closed_by_peer(s):
    try:
        return s.recv(100) == b""
    except ConnectionResetError:  # closed with unread bytes: the kernel answers with a reset
        return True
    except socket.timeout:
        return False


def test_fuzz_decoder_rejects_and_keeps_serving(server):
    rng = random.Random(4)
    addr = server.addr
    # 1) random bytes before/instead of the handshake
    for i in range(60):
        s = socket.create_connection(rpc.parse_addr(addr), timeout=5)
        try:
            s.sendall(rng.randbytes(rng.randrange(1, 300)))
            s.shutdown(socket.SHUT_WR)
            s.recv(100)  # handshake answer or close; never a frame
        except OSError:  # reset / not connected: the server already closed it
            pass
        s.close()
    # 2) authenticated connections, then malformed frames
    for i in range(80):
        s, key, fl = _authed_socket(addr)
        meta = b'{"m":"echo"}'
        data = rng.randbytes(rng.randrange(0, 100))
        hdr = rpc.HEADER.pack(b"3F", 1, 0, 0, len(meta), len(data))
        frame = bytearray(hdr + rpc._mac(key, hdr, meta, [data], fl) + meta + data)
        kind = i % 5
        if kind == 0:  # flip a random byte
            frame[rng.randrange(len(frame))] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncate
            frame = frame[:rng.randrange(len(frame))]
        elif kind == 2:  # random body after a valid-length header
            frame = frame[:rpc.HEADER.size] + rng.randbytes(len(frame) - rpc.HEADER.size)
        elif kind == 3:  # huge lengths
            frame = rpc.HEADER.pack(b"3F", 1, 0, 0, 1 << 30, (1 << 32) - 1) + bytes(16)
        else:  # valid MAC, invalid JSON
            meta = rng.randbytes(20)
            hdr = rpc.HEADER.pack(b"3F", 1, 0, 0, len(meta), 0)
            frame = hdr + rpc._mac(key, hdr, meta, [], fl) + meta
        try:
            s.sendall(bytes(frame))
            s.shutdown(socket.SHUT_WR)  # a length made larger by a flip ends as a truncation
        except OSError:
            pass
        assert _closed_by_peer(s)
        s.close()
    assert server.stats["rejected"] >= 80
    c = rpc.Client(SECRET)
    assert bytes(c.call(addr, "echo", {"n": 5}, b"still")[1]) == b"still"


def test_replayed_frame_is_rejected(server):
    s, key, fl = _authed_socket(server.addr)
    meta = b'{"m":"echo","n":1}'
    hdr = rpc.HEADER.pack(b"3F", 1, 0, 0, len(meta), 0)
    frame = hdr + rpc._mac(key, hdr, meta, [], fl) + meta
    s.sendall(frame)
    ch = rpc.Channel(s, key, fl)
    ch.send_seq = 1
    res, _ = ch.recv(1)
    assert res["n"] == 1
    s.sendall(frame)  # same bytes again: sequence number 0 is stale
    assert _closed_by_peer(s)
    s.close()


def test_bad_addresses():
    with pytest.raises(ValueError, match="host:port"):
        rpc.parse_addr("localhost")


@pytest.mark.parametrize("offer", [rpc.FLAG_GMAC | rpc.FLAG_POLY1305, rpc.FLAG_POLY1305, 0])
def test_payload_tamper_detected(server, offer):
    if not rpc.LOCAL_FLAGS:
        pytest.skip("cryptography not installed")
    s = socket.create_connection(rpc.parse_addr(server.addr), timeout=5)
    key, fl = rpc.client_handshake(s, SECRET.encode(), offer)
    assert fl == (rpc.FLAG_GMAC if offer & rpc.FLAG_GMAC else offer)
    meta, data = b'{"m":"echo"}', bytearray(os.urandom(5000))
    hdr = rpc.HEADER.pack(b"3F", 1, 0, 0, len(meta), len(data))
    mac = rpc._mac(key, hdr, meta, [data], fl)
    data[1234] ^= 1
    s.sendall(hdr + mac + meta + data)
    assert _closed_by_peer(s)
    s.close()


def test_gmac_tag_matches_reference():
    """The payload tag is AES-128-GCM's tag with an empty plaintext and the payload as
    associated data (NIST SP 800-38D GMAC); check it against the AES-GCM of `cryptography`
    called directly, and that any flipped payload bit or other sequence number changes it."""
    if not rpc.LOCAL_FLAGS:
        pytest.skip("cryptography not installed")
    import hashlib
    import hmac
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    key, meta = os.urandom(32), b'{"m":"x"}'
    data = bytearray(os.urandom(random.randrange(1, 200000)))
    hdr = rpc.HEADER.pack(b"3F", 1, 1, 77, len(meta), len(data))
    tag = AESGCM(hmac.digest(key, b"gmac", "sha256")[:16]).encrypt(
        bytes([1]) + (77).to_bytes(8, "big") + bytes(3), b"", bytes(data))
    want = hmac.new(key, hdr + meta + tag, hashlib.sha256).digest()[:rpc.MAC_LEN]
    assert rpc._mac(key, hdr, meta, [data], rpc.FLAG_GMAC) == want
    half = len(data) // 2
    assert rpc._mac(key, hdr, meta, [data[:half], data[half:]], rpc.FLAG_GMAC) == want
    g = rpc._gmac_for(key)  # the nonce follows kind and sequence number
    assert g.encrypt(hdr[3:12] + bytes(3), b"", bytes(data)) == tag
    assert g.encrypt(bytes([0]) + hdr[4:12] + bytes(3), b"", bytes(data)) != tag
    data[random.randrange(len(data))] ^= 1 << random.randrange(8)
    assert rpc._mac(key, hdr, meta, [data], rpc.FLAG_GMAC) != want


@pytest.mark.parametrize("blocks", [False, True])
def test_zero_copy_file_answers_are_crc_checked(server, tmp_path, blocks):
    """Kind-2 answers (sendfile from a file, payload covered by its CRC32C instead of the MAC)
    arrive intact into the caller's buffer; a payload that does not match its CRC (as after
    corruption on disk or in transit) is answered as error CHECKSUM and the connection stays
    usable; a kind-2 frame without a CRC is rejected."""
    rng = random.Random()
    data = rng.randbytes(rng.randrange(3 << 20, 4 << 20))
    p = tmp_path / "f"
    p.write_bytes(data)
    c = rpc.Client(SECRET)
    for off, n in ((0, len(data)), (4096, 1 << 20), (8192, 4096 * 3 + 17)):
        buf = bytearray(b"\xee" * (n + 5))
        res, back = c.call(server.addr, "file", {"path": str(p), "off": off, "n": n,
                                                 "blocks": blocks}, into=buf)
        assert res == {"n": n} and bytes(back) == data[off:off + n] == bytes(buf[:n])
        assert buf[n:] == b"\xee" * 5
        res, back = c.call(server.addr, "file", {"path": str(p), "off": off, "n": n,
                                                 "blocks": blocks})  # no buffer given
        assert bytes(back) == data[off:off + n]
    if not blocks:
        with pytest.raises(rpc.RpcError) as ei:
            c.call(server.addr, "file", {"path": str(p), "off": 0, "n": 5000, "lie": True})
        assert ei.value.code == "CHECKSUM"
        assert c.call(server.addr, "echo", {"n": 2}, b"ok")[1] == b"ok"  # same channel, in sync
    # a kind-2 frame whose meta carries no CRC is rejected by the receiver
    key = os.urandom(32)
    meta = b'{"n":3}'
    hdr = rpc.HEADER.pack(b"3F", 1, 2, 0, len(meta), 3)
    a, b = socket.socketpair()
    a.sendall(hdr + rpc._mac(key, hdr, meta, [], rpc.FLAG_GMAC) + meta + b"abc")
    with pytest.raises(rpc.ProtocolError, match="_crc"):
        rpc.Channel(b, key, rpc.FLAG_GMAC).recv(1)
    a.close()
    b.close()
    c.close()


def test_crc_covered_requests(server):
    """Kind-3 requests (the CRAQ forward: payload covered by the CRC32C in the MACed meta
    instead of the payload MAC) arrive intact; a payload that does not match its CRC, a kind-3
    frame without a CRC, a frame whose meta was changed (CRC swapped) and one MACed with a key
    not derived from the cluster secret are all rejected (connection closed) and the server
    keeps serving."""
    from threefs import _C
    rng = random.Random()
    c = rpc.Client(SECRET)
    for n in (1, 4096, 1 << 20, rng.randrange(1, 3 << 20)):
        d = rng.randbytes(n)
        res, back = c.call(server.addr, "echo", {"n": n}, d, crc=_C.crc32c(d))
        assert res == {"n": n, "len": n} and bytes(back) == d
    with pytest.raises(ValueError, match="kind"):
        rpc.Channel(socket.socket(), b"k" * 32).send(1, {}, b"x", crc=0)

    def frame(key, fl, meta, data, mac_meta=None):
        hdr = rpc.HEADER.pack(b"3F", 1, 3, 0, len(meta), len(data))
        return hdr + rpc._mac(key, hdr, mac_meta or meta, [], fl) + meta + data

    data = bytearray(rng.randbytes(5000))
    good = b'{"m":"echo","n":1,"_pcrc":%d}' % _C.crc32c(bytes(data))
    s, key, fl = _authed_socket(server.addr)  # control: the well-formed frame is answered
    s.sendall(frame(key, fl, good, data))
    ch = rpc.Channel(s, key, fl)
    ch.send_seq = 1
    assert ch.recv(1)[0] == {"n": 1, "len": 5000}
    s.close()
    bad = bytearray(data)
    bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
    other = b'{"m":"echo","n":1,"_pcrc":%d}' % _C.crc32c(bytes(bad))
    for key_of, meta, payload, mac_meta in (
            (None, good, bad, None),  # payload changed in transit
            (None, b'{"m":"echo","n":1}', data, None),  # no CRC
            (None, other, bad, good),  # CRC in the meta replaced to fit: the MAC catches it
            (os.urandom(32), good, data, None)):  # sender without the cluster secret
        s, key, fl = _authed_socket(server.addr)
        s.sendall(frame(key_of or key, fl, meta, payload, mac_meta))
        assert _closed_by_peer(s)
        s.close()
    assert c.call(server.addr, "echo", {"n": 2}, b"ok", crc=_C.crc32c(b"ok"))[1] == b"ok"
    # the receiver's one pass gives the handler the payload's CRC and block CRCs (for the
    # chunk engine); a sender cannot supply them in its meta
    d = rng.randbytes(rng.randrange(1, 3 << 20))
    crc, blocks = _C.crc32c_sums(d)
    got = c.call(server.addr, "sums", {}, d, crc=crc)[0]["sums"]
    assert got == [crc, blocks.hex()] and crc == _C.crc32c(d)
    assert c.call(server.addr, "sums", {"_sums": [crc, blocks.hex()]}, d)[0]["sums"] is None
    c.close()
