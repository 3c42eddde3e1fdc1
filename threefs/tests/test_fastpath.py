"""The storage node's C++ full-chunk write path (_C.FastPath): same answers, checks and replicas
as the Python path it replaces for ordinary full-chunk forwards."""
import hashlib
import hmac
import json
import os
import random
import socket
import time

import pytest

from threefs import _C, rpc
from threefs.chunk import chunk_id

from test_storage_craq import make_cluster, replica_metas


def test_hmac_sha256_matches_hashlib():
    rng = random.Random(3)
    for n in (0, 1, 55, 56, 63, 64, 65, 119, 120, 1000):
        for kl in (8, 32, 64, 65, 200):
            key, msg = rng.randbytes(kl), rng.randbytes(n)
            assert _C.hmac_sha256(key, msg) == hmac.new(key, msg, hashlib.sha256).digest()


def test_gmac_matches_cryptography():
    if not _C.gmac_available():
        pytest.skip("no libcrypto.so.3: client frames are checked in Python")
    AESGCM = pytest.importorskip("cryptography.hazmat.primitives.ciphers.aead").AESGCM
    rng = random.Random(5)
    for n in (0, 1, 15, 16, 17, 4096, 100_003, 1 << 20):
        key, nonce, data = rng.randbytes(16), rng.randbytes(12), rng.randbytes(n)
        assert _C.gmac(key, nonce, data) == AESGCM(key).encrypt(nonce, b"", data)


@pytest.fixture(params=[True, False], ids=["fast", "python"])
def cluster(request, tmp_path):
    mg, nodes, sc, rc = make_cluster(tmp_path, fast_path=request.param)
    yield request.param, nodes, sc, rc
    for n in nodes:
        n.stop()
    mg.stop()
    rc.close()


def test_full_chunk_writes_replicate(cluster):
    fast, nodes, sc, rc = cluster
    rng = random.Random(11)
    want = {}
    for i in range(12):  # new chunks, rewrites of the same size, shorter and longer rewrites
        cid = chunk_id(60, i % 5)
        data = rng.randbytes(rng.choice([1 << 20, 4096, 123_457, 1 << 20]))
        sc.write_chunk(1, cid, 0, data)
        want[cid] = data if len(data) >= len(want.get(cid, b"")) else \
            data + want[cid][len(data):]
    for cid, data in want.items():
        ms = replica_metas(nodes, cid)
        assert all(m == ms[0] for m in ms) and ms[0]["pending_ver"] == 0
        for i, n in enumerate(nodes, 1):
            assert n.engines[10 + i].read(cid) == data
        assert sc.read_chunk(1, cid, 0, 1 << 20) == data
    handled = [n.fp.handled for n in nodes]
    if fast:  # the middle and the tail took the full-chunk forwards in C++, the head the
        # client's full-chunk writes (where libcrypto is there for their AES-GMAC)
        assert handled[1] >= 1 and handled[2] >= 1, handled
        assert (handled[0] >= 1) == _C.gmac_available(), handled
    else:
        assert handled == [0, 0, 0]


def _fwd_args(sc, cid, ver, data, **kw):
    chain = sc.routing.chain(1)
    return {"chain": 1, "chain_ver": chain["ver"], "chunk": cid.hex(), "ver": ver, "offset": 0,
            "truncate_to": -1, "crc": _C.crc32c(data), "full": True, **kw}


def test_forward_checks(cluster):
    """Direct forwards to the tail: a retried one is answered once applied, a stale chain
    version is refused, a payload whose CRC32C does not match is rejected (connection closed)
    and the node keeps serving; a CRC claim that does not match the content aborts it."""
    fast, nodes, sc, rc = cluster
    tail = nodes[2]
    cid, data = chunk_id(61, 0), os.urandom(300_000)
    for _ in range(2):  # the second is a retried forward of the same version
        res, _ = rc.call(tail.addr, "fwd", _fwd_args(sc, cid, 1, data), data,
                         crc=_C.crc32c(data))
        assert res == {"ver": 1}
    assert tail.engines[13].read(cid) == data and tail.engines[13].meta(cid)["committed_ver"] == 1
    with pytest.raises(rpc.RpcError) as ei:
        args = _fwd_args(sc, cid, 2, data)
        args["chain_ver"] -= 1
        rc.call(tail.addr, "fwd", args, data, crc=_C.crc32c(data))
    assert ei.value.code == "CHAIN_VERSION"
    rejected = tail.server.stats["rejected"]
    with pytest.raises(ConnectionError):  # payload CRC wrong: the frame is rejected
        rc.call(tail.addr, "fwd", _fwd_args(sc, cid, 2, data), data, crc=_C.crc32c(data) ^ 1)
    end = time.time() + 5
    while tail.server.stats["rejected"] == rejected and time.time() < end:
        time.sleep(0.01)
    assert tail.server.stats["rejected"] == rejected + 1
    other = os.urandom(1000)  # the claimed CRC of the content is not the content's: refused
    with pytest.raises(rpc.RpcError) as ei:
        rc.call(tail.addr, "fwd", _fwd_args(sc, cid, 2, other, crc=_C.crc32c(data)), other,
                crc=_C.crc32c(other))
    assert ei.value.code == "CHECKSUM"
    assert tail.engines[13].meta(cid)["pending_ver"] == 0
    assert tail.engines[13].read(cid) == data


def test_lost_successor_answers_retry(cluster):
    fast, nodes, sc, rc = cluster
    cid, data = chunk_id(62, 0), os.urandom(1 << 20)
    sc.write_chunk(1, cid, 0, data)  # the head now holds a connection to the middle
    nodes[1].stop()
    chain = sc.routing.chain(1)
    with pytest.raises(rpc.RpcError) as ei:
        rc.call(nodes[0].addr, "write", {"chain": 1, "chain_ver": chain["ver"],
                                         "chunk": cid.hex(), "offset": 0}, os.urandom(1 << 20))
    assert ei.value.code == "RETRY"
    assert nodes[0].engines[11].meta(cid)["committed_ver"] == 1


def test_tampered_client_write_is_rejected(cluster):
    """A full-chunk write whose payload no longer matches its frame MAC (AES-GMAC) closes the
    connection at the head; nothing is written and the head keeps serving."""
    fast, nodes, sc, rc = cluster
    head, cid = nodes[0], chunk_id(63, 0)
    data = os.urandom(1 << 20)
    sc.write_chunk(1, cid, 0, data)
    chain = sc.routing.chain(1)
    ch = rc._get(head.addr)
    mb = json.dumps({"m": "write", "chain": 1, "chain_ver": chain["ver"], "chunk": cid.hex(),
                     "offset": 0, "truncate_to": -1}, separators=(",", ":")).encode()
    other = bytearray(os.urandom(1 << 20))
    hdr = rpc.HEADER.pack(b"3F", 1, 0, ch.send_seq, len(mb), len(other))
    mac = rpc._mac(ch.key, hdr, mb, [bytes(other)], ch.flags)
    other[777] ^= 1
    rejected = head.server.stats["rejected"]
    ch.sock.sendall(hdr + mac + mb + bytes(other))
    ch.set_timeout(5)
    assert ch.sock.recv(1) == b""  # closed, no answer
    ch.close()
    assert head.server.stats["rejected"] == rejected + 1
    for i, n in enumerate(nodes, 1):
        assert n.engines[10 + i].meta(cid)["committed_ver"] == 1
        assert n.engines[10 + i].read(cid) == data
    sc.write_chunk(1, cid, 0, bytes(other))
    assert sc.read_chunk(1, cid, 0, 1 << 20) == bytes(other)


def _mutate(rng, b: bytes) -> bytes:
    b = bytearray(b)
    for _ in range(rng.randrange(1, 4)):
        op, i = rng.randrange(4), rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(i, len(b) - 1)] = rng.randrange(256)
        elif op == 1:
            b[i:i] = rng.choice([b'"', b"{", b"}", b"[", b",", b":", b"-", b"1e3", b"\\u00", b"\\",
                                 b"99999999999999999999", b"null", b"true", b" "])
        elif op == 2:
            del b[i:i + rng.randrange(1, 8)]
        else:
            b = b[:i]
    return bytes(b)


def test_fuzzed_frames_after_the_handshake(cluster):
    """Authenticated connections sending random bytes, frames with broken headers, and MACed
    frames whose meta is a mutated forward or client write (random JSON damage, wrong types,
    huge numbers, unknown chains): every one is answered or rejected, the nodes keep serving and
    the chain's replicas stay identical."""
    fast, nodes, sc, rc = cluster
    rng = random.Random(17)
    chain = sc.routing.chain(1)
    data = rng.randbytes(8192)
    crc = _C.crc32c(data)
    fwd = json.dumps({"m": "fwd", "chain": 1, "chain_ver": chain["ver"],
                      "chunk": chunk_id(99, 0).hex(), "ver": 1, "offset": 0, "truncate_to": -1,
                      "crc": crc, "full": True, "_pcrc": crc}, separators=(",", ":")).encode()
    write = json.dumps({"m": "write", "chain": 1, "chain_ver": chain["ver"],
                        "chunk": chunk_id(99, 1).hex(), "offset": 0, "truncate_to": -1},
                       separators=(",", ":")).encode()
    for i in range(90):
        node = nodes[i % 3]
        ch = rc._get(node.addr)
        mode = i % 5
        if mode == 0:
            frame = rng.randbytes(rng.randrange(1, 3000))
        elif mode == 1:  # a header with random fields and a random MAC
            frame = rpc.HEADER.pack(b"3F", 1, rng.choice([0, 3, 1, 7]), rng.randrange(3),
                                    rng.randrange(1 << 21), rng.randrange(1 << 27)) \
                + rng.randbytes(16 + rng.randrange(200))
        else:  # MACed: kind 3 forwards to any node, kind 0 client writes (GMAC'd payload)
            kind = 3 if mode == 2 else 0
            mb = _mutate(rng, fwd if kind == 3 else write) if mode != 4 else \
                (fwd if kind == 3 else write)
            hdr = rpc.HEADER.pack(b"3F", 1, kind, ch.send_seq, len(mb), len(data))
            frame = hdr + rpc._mac(ch.key, hdr, mb, [data] if kind == 0 else [], ch.flags) \
                + mb + data
        ch.set_timeout(10)
        try:
            ch.sock.sendall(frame)
            ch.sock.shutdown(socket.SHUT_WR)
            while ch.sock.recv(1 << 16):
                pass
        except OSError:
            pass
        ch.close()
    payload = os.urandom(1 << 20)
    cid = chunk_id(98, 0)
    sc.write_chunk(1, cid, 0, payload)
    assert sc.read_chunk(1, cid, 0, 1 << 20) == payload
    for c in (cid, chunk_id(99, 0), chunk_id(99, 1)):
        ms = replica_metas(nodes, c)
        if c == cid:
            assert all(m == ms[0] for m in ms) and ms[0]["committed_ver"] == 1
        for i, n in enumerate(nodes, 1):  # whatever was accepted is intact where it is stored
            m = n.engines[10 + i].meta(c)
            if m and m["committed_ver"]:
                n.engines[10 + i].read(c)  # verifies the CRCs


def test_meta_reader_never_takes_what_python_rejects():
    """The C++ reader of the JSON meta against json.loads on valid and damaged metas: whatever it
    takes, Python's decoder takes too, with the same member values (ints, strings, booleans);
    the rest it leaves to Python."""
    rng = random.Random(23)
    base = [json.dumps(m, separators=(",", ":")).encode() for m in (
        {"m": "fwd", "chain": 3, "chain_ver": 4294967301, "chunk": "00ab" * 6, "ver": 7,
         "offset": 0, "truncate_to": -1, "crc": 4000000000, "full": True, "_pcrc": 1},
        {"err": "CHAIN_VERSION", "msg": "chain 1 is at v5, \"quoted\" \\ \u00e9", "ver": 5,
         "x": [1, {"y": None}], "f": 1.5e-3})]
    taken = 0
    for i in range(3000):
        text = base[i % 2] if i < 2 else _mutate(rng, base[i % 2])
        got = _C._json_members(text)
        if got is None:
            continue
        taken += 1
        py = json.loads(text)  # must not raise
        assert isinstance(py, dict) and len(py) == len(got), text
        for k, v in got.items():
            pv = py[k.decode()]
            if isinstance(v, bool) or v is None:
                assert pv is v, text
            elif isinstance(v, int):
                assert type(pv) is int and pv == v, text
            elif isinstance(v, bytes):  # ASCII text as Python reads it; other text is no ASCII
                assert pv == v.decode() if v.isascii() else not pv.isascii(), text
    assert taken > 100
    assert _C._json_members(b'{"\\u0074runcate_to":5}') == {b"truncate_to": 5}
