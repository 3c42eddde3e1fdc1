"""The storage node's C++ full-chunk write path (_C.FastPath): same answers, checks and replicas
as the Python path it replaces for ordinary full-chunk forwards."""
import hashlib
import hmac
import json
import os
import random
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
