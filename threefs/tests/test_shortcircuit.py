"""Short-circuit local reads (shortcircuit.py): a descriptor of the committed chunk file, read by
the client from the page cache; correct under concurrent CRAQ writes, chain changes, a wrong
secret, and a replica without a short-circuit socket (TCP then)."""
import os
import random
import socket
import threading
import time

import pytest

from threefs import rpc, shortcircuit
from threefs.chunk import chunk_id
from threefs.common import MgmtdClient
from threefs.storage_client import StorageClient

from test_storage_craq import SECRET, make_cluster, replica_metas

MiB = 1 << 20


@pytest.fixture
def craq(tmp_path):
    mg, nodes, sc, rc = make_cluster(tmp_path)
    yield mg, nodes, sc, rc
    sc.close()
    for n in nodes:
        n.stop()
    mg.stop()
    rc.close()


def args_for(sc, cid, off=0, n=MiB):
    return {"chain": 1, "chain_ver": sc.routing.chain(1)["ver"], "chunk": cid.hex(),
            "offset": off, "length": n}


def test_reads_go_short_circuit_and_match(craq):
    mg, nodes, sc, rc = craq
    rng = random.Random(11)
    cid = chunk_id(60, 0)
    data = rng.randbytes(MiB)
    sc.write_chunk(1, cid, 0, data)
    buf = bytearray(b"\xAA" * MiB)  # poisoned
    assert sc.read_chunk(1, cid, 0, MiB, into=buf) == MiB and buf == data
    for _ in range(5):  # aligned partial ranges: per-4 KiB-block CRCs
        off = rng.randrange(0, 200) * 4096
        n = rng.randrange(16, 50) * 4096
        assert sc.read_chunk(1, cid, off, n) == data[off:off + n]
    assert sc.sc.stats["reads"] == 6 and sc.sc.stats["fallbacks"] == 0
    assert sum(n.sc.stats["reads"] for n in nodes) == 6
    # an unaligned range is refused short-circuit and read over TCP
    assert sc.read_chunk(1, cid, 100, 100_000) == data[100:100_100]
    assert sc.sc.stats["fallbacks"] == 1
    # small reads go over TCP from the start (a descriptor costs more than the bytes)
    assert sc.read_chunk(1, cid, 8192, 4096) == data[8192:12288]
    assert sc.sc.stats["reads"] == 6 and sc.sc.stats["requests"] == 7
    # a chunk with nothing committed reads as empty, without a descriptor
    assert sc.read_chunk(1, chunk_id(60, 1), 0, MiB) == b""
    # opt-out: the same reads over TCP only
    off_client = StorageClient(rc, MgmtdClient([mg.addr], rc), deadline_s=20, short_circuit=False)
    assert off_client.sc is None
    before = sum(n.sc.stats["reads"] for n in nodes)
    assert off_client.read_chunk(1, cid, 0, MiB) == data
    assert sum(n.sc.stats["reads"] for n in nodes) == before
    # leases end: released with the next request or by the idle flush
    end = time.time() + 5
    while sum(n.sc.stats["leases"] for n in nodes) and time.time() < end:
        time.sleep(0.02)
    assert sum(n.sc.stats["leases"] for n in nodes) == 0


def test_descriptor_keeps_the_committed_version_while_writes_recycle_files(craq):
    """The lease: while a client holds a descriptor, the replaced file is not recycled, so
    however many copy-on-write updates follow, the descriptor shows the version it was opened
    at. The control (a plain descriptor of the same file, without a lease, once the lease is
    gone) shows that recycling really overwrites replaced files in place."""
    mg, nodes, sc, rc = craq
    cid = chunk_id(61, 0)
    v1 = os.urandom(MiB)
    sc.write_chunk(1, cid, 0, v1)
    cl = shortcircuit.Client(SECRET)
    try:
        p = cl.start(nodes[2].addr, args_for(sc, cid))
        res, fd = p.receive()
        assert res["found"] and res["n"] == MiB and fd >= 0
        for _ in range(30):  # each replaces the chunk file; replaced files go to the pool
            sc.write_chunk(1, cid, 0, os.urandom(MiB))
        got = os.pread(fd, MiB, res["off"])
        os.close(fd)
        assert got == v1
        p.release(res)
        # control: the same kind of descriptor without a lease sees recycled content
        path = nodes[2].engines[13].chunk_path(cid)
        cur = nodes[2].engines[13].read(cid)
        raw = os.open(path, os.O_RDONLY)
        try:
            time.sleep(3 * shortcircuit.RELEASE_AFTER_S + 0.05)  # the lease above is released
            for _ in range(60):  # more than the pool holds: every pooled file is reused
                sc.write_chunk(1, cid, 0, os.urandom(MiB))
            assert os.pread(raw, MiB, 64) != cur  # overwritten in place by a later version
        finally:
            os.close(raw)
    finally:
        cl.close()


def test_concurrent_writer_reads_never_torn_nor_stale(craq):
    """Full-chunk versions (every byte = the version number) written continuously; readers
    through short-circuit see whole versions only, never one older than a version acknowledged
    before the read began (CRAQ: an acked write is committed on every replica)."""
    mg, nodes, sc, rc = craq
    cid = chunk_id(62, 0)
    size = 256 << 10
    sc.write_chunk(1, cid, 0, bytes([1]) * size)
    acked = [1]
    stop = threading.Event()
    errors = []

    def writer():
        v = 1
        while not stop.is_set() and v < 200:
            v += 1
            sc.write_chunk(1, cid, 0, bytes([v]) * size)
            acked[0] = v

    def reader():
        r = StorageClient(rc, MgmtdClient([mg.addr], rc), deadline_s=20)
        try:
            buf = bytearray(size)
            while not stop.is_set():
                lo = acked[0]
                buf[:] = b"\xFF" * size
                n = r.read_chunk(1, cid, 0, size, into=buf)
                v = buf[0]
                if n != size or buf != bytes([v]) * size or v < lo:
                    errors.append((n, v, lo, len(set(buf))))
                    return
        finally:
            r.close()

    ts = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(2)]
    for t in ts:
        t.start()
    ts[0].join(timeout=60)
    stop.set()
    for t in ts:
        t.join(timeout=20)
    assert not errors, errors
    assert acked[0] >= 20
    assert sum(n.sc.stats["reads"] for n in nodes) > 20


def test_stale_chain_version_and_not_serving_get_no_descriptor(craq):
    mg, nodes, sc, rc = craq
    cid = chunk_id(63, 0)
    sc.write_chunk(1, cid, 0, b"q" * 131072)
    cl = shortcircuit.Client(SECRET)
    try:
        for n in nodes:
            a = {**args_for(sc, cid), "chain_ver": sc.routing.chain(1)["ver"] - 1}
            with pytest.raises(rpc.RpcError) as ei:
                cl.read(n.addr, a)
            assert ei.value.code == "CHAIN_VERSION"
        # a chain change: the head goes away; reads go on from the others, short-circuit
        nodes[0].stop()
        ver0 = sc.routing.chain(1)["ver"]
        end = time.time() + 20
        while time.time() < end and sc.routing.chain(1)["ver"] == ver0:
            sc.refresh(force=True)
            time.sleep(0.05)
        assert sc.routing.chain(1)["ver"] > ver0
        before = sum(n.sc.stats["reads"] for n in nodes[1:])
        for _ in range(6):
            assert sc.read_chunk(1, cid, 0, 131072) == b"q" * 131072
        assert sum(n.sc.stats["reads"] for n in nodes[1:]) == before + 6
        # a reader still on the old chain version is refused, without a descriptor
        with pytest.raises(rpc.RpcError) as ei:
            cl.read(nodes[1].addr, {**args_for(sc, cid), "chain_ver": ver0})
        assert ei.value.code == "CHAIN_VERSION"
    finally:
        cl.close()


def test_wrong_secret_gets_no_descriptor(craq):
    mg, nodes, sc, rc = craq
    cid = chunk_id(64, 0)
    sc.write_chunk(1, cid, 0, b"s" * 4096)
    bad = shortcircuit.Client("not-the-cluster-secret")
    try:
        rejected = nodes[0].sc.stats["rejected"]
        with pytest.raises(rpc.AuthError):
            bad.read(nodes[0].addr, args_for(sc, cid))
        end = time.time() + 5  # the node notices when the client hangs up on it
        while nodes[0].sc.stats["rejected"] == rejected and time.time() < end:
            time.sleep(0.01)
        assert nodes[0].sc.stats["rejected"] == rejected + 1
        assert nodes[0].sc.stats["reads"] == 0
    finally:
        bad.close()
    bad_rc = rpc.Client("not-the-cluster-secret")  # nor over TCP
    with pytest.raises(rpc.AuthError):
        bad_rc.call(nodes[0].addr, "read", {**args_for(sc, cid), "zc": True})


def test_replica_without_short_circuit_is_read_over_tcp(craq):
    mg, nodes, sc, rc = craq
    cid = chunk_id(65, 0)
    data = os.urandom(300_000)
    sc.write_chunk(1, cid, 0, data)
    for n in nodes:  # as if every replica were on another host
        n.sc.stop()
    fresh = StorageClient(rc, MgmtdClient([mg.addr], rc), deadline_s=20)
    try:
        for _ in range(5):
            assert fresh.read_chunk(1, cid, 0, 300_000) == data
        assert fresh.sc.stats["reads"] == 0
        assert not any(fresh.sc.local(n.addr) for n in nodes)  # remembered: no socket tries
    finally:
        fresh.close()


def test_storage_config_turns_the_socket_off(tmp_path):
    from threefs.storage import StorageNode
    cfg = {"node_id": "x", "listen": "127.0.0.1:0", "secret": SECRET, "mgmtd": ["127.0.0.1:1"],
           "targets": [{"id": 99, "path": str(tmp_path / "t")}]}
    for on in (False, True):
        node = StorageNode({**cfg, "short_circuit": on})  # not started: no mgmtd needed
        cl = shortcircuit.Client(SECRET)
        try:
            assert (node.sc is not None) == on
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                if on:
                    s.connect(shortcircuit.sock_name(node.addr))  # bound and listening
                else:
                    with pytest.raises(OSError):
                        s.connect(shortcircuit.sock_name(node.addr))
                    with pytest.raises(shortcircuit.Fallback):
                        cl.read(node.addr, {"chain": 1, "chain_ver": 1, "chunk": "00",
                                            "offset": 0, "length": 4096})
                    assert not cl.local(node.addr)  # remembered: TCP for a while
            finally:
                s.close()
        finally:
            cl.close()
            node.server.sock.close()
            if node.sc is not None:
                node.sc.sock.close()


def test_flipped_byte_caught_by_client_and_repaired(craq):
    mg, nodes, sc, rc = craq
    cid = chunk_id(66, 0)
    data = os.urandom(MiB)
    sc.write_chunk(1, cid, 0, data)
    path = nodes[1].engines[12].chunk_path(cid)
    with open(path, "r+b") as f:
        f.seek(64 + 9000)
        b = f.read(1)
        f.seek(64 + 9000)
        f.write(bytes([b[0] ^ 0x01]))
    cl = shortcircuit.Client(SECRET)
    try:
        with pytest.raises(rpc.RpcError) as ei:
            cl.read(nodes[1].addr, args_for(sc, cid))
        assert ei.value.code == "CHECKSUM"
    finally:
        cl.close()
    buf = bytearray(MiB)
    assert sc._read_replica(nodes[1].addr, args_for(sc, cid), buf) == MiB and buf == data
    assert nodes[1].stats["repairs"] == 1 and sc.stats["crc_retries"] == 1
    assert replica_metas(nodes, cid)[1] == replica_metas(nodes, cid)[0]


def test_batch_answers_each_range_on_its_own(craq):
    """One sc_read of several ranges: found ones get a descriptor each, the others their own
    answer (nothing committed, unaligned -> TCP, stale chain version)."""
    mg, nodes, sc, rc = craq
    a, b = chunk_id(67, 0), chunk_id(67, 1)
    da, db = os.urandom(MiB), os.urandom(300_000)
    sc.write_chunk(1, a, 0, da)
    sc.write_chunk(1, b, 0, db)
    cl = shortcircuit.Client(SECRET)
    try:
        items = [args_for(sc, a), args_for(sc, b, 8192, 300_000), args_for(sc, chunk_id(67, 2)),
                 args_for(sc, a, 10, 100), {**args_for(sc, b), "chain_ver": 0}]
        ps = cl.start_batch(nodes[1].addr, items)
        buf = bytearray(b"\x55" * MiB)
        assert ps[0].finish(buf) == (MiB, memoryview(buf)) and buf == da
        n, d = ps[1].finish()
        assert n == 300_000 - 8192 and bytes(d) == db[8192:]
        assert ps[2].finish() == (0, b"")
        with pytest.raises(shortcircuit.Fallback):
            ps[3].finish()
        with pytest.raises(rpc.RpcError) as ei:
            ps[4].finish()
        assert ei.value.code == "CHAIN_VERSION"
        assert nodes[1].sc.stats["reads"] == 2
        with pytest.raises(ValueError):
            cl.start_batch(nodes[1].addr, [args_for(sc, a)] * (shortcircuit.MAX_ITEMS + 1))
    finally:
        cl.close()


def test_read_verify_reads_and_checks_in_one_pass(tmp_path):
    """_C.read_verify: the bytes of a file range into a buffer, checked against a whole-range
    CRC32C or per-4 KiB-block CRCs (the oracle: _C.crc32c / crc32c_blocks on the written bytes);
    a flipped byte, a wrong table or a range past the end is reported, a bad descriptor raises."""
    import struct
    from threefs import _C

    rng = random.Random()
    n = rng.randrange(1, 300) * 4096 + rng.randrange(0, 4096)
    data = rng.randbytes(n)
    path = tmp_path / "f"
    path.write_bytes(b"h" * 4096 + data)

    def blocks(b):
        crcs = _C.crc32c_blocks(b)[1]
        return struct.pack(f"<{len(crcs)}I", *crcs)

    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(b"\xaa" * n)
        assert _C.read_verify(fd, buf, 4096, _C.crc32c(data)) == (n, True) and buf == data
        buf[:] = b"\xaa" * n
        assert _C.read_verify(fd, buf, 4096, 0, blocks(data)) == (n, True) and buf == data
        assert _C.read_verify(fd, buf, 4096, _C.crc32c(data) ^ 1) == (n, False)
        bad = bytearray(blocks(data))
        bad[-1] ^= 1
        assert _C.read_verify(fd, buf, 4096, 0, bytes(bad)) == (n, False)
        assert _C.read_verify(fd, buf, 4096, 0, blocks(data)[:-4]) == (0, False)
        # past the end of the file: fewer bytes than asked, never verified
        assert _C.read_verify(fd, buf, 8192, _C.crc32c(data)) == (n - 4096, False)
    finally:
        os.close(fd)
    with open(path, "r+b") as f:  # one flipped byte on disk
        f.seek(4096 + rng.randrange(n))
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _C.read_verify(fd, buf, 4096, _C.crc32c(data)) == (n, False)
        assert _C.read_verify(fd, buf, 4096, 0, blocks(data)) == (n, False)
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        _C.read_verify(fd, buf, 0, 0)  # closed descriptor
    with pytest.raises((BufferError, TypeError, ValueError)):
        _C.read_verify(0, b"read-only", 0, 0)
