"""CRAQ storage semantics with mgmtd and three storage nodes running in this process."""
import os
import random
import time

import pytest

from threefs import rpc
from threefs.chunk import chunk_id
from threefs.cluster import free_port
from threefs.common import MgmtdClient
from threefs.mgmtd import Mgmtd
from threefs.storage import StorageNode
from threefs.storage_client import StorageClient

SECRET = "craq-test-secret"


def make_cluster(tmp_path, capacity=1 << 30, capacities=None, **node_cfg):
    m_addr = f"127.0.0.1:{free_port()}"
    targets = {"11": "n1", "12": "n2", "13": "n3"}
    mg = Mgmtd({"node_id": "m1", "listen": m_addr, "secret": SECRET,
                "kv": {"backend": "sqlite", "path": str(tmp_path / "m.sqlite")},
                "lease_s": 1.0, "heartbeat_timeout_s": 1.5, "tick_s": 0.05,
                "targets": targets, "chains": [{"id": 1, "targets": [11, 12, 13]}]}).start()
    nodes = []
    for i in (1, 2, 3):
        nodes.append(StorageNode({
            "node_id": f"n{i}", "listen": "127.0.0.1:0", "secret": SECRET, "mgmtd": [m_addr],
            "heartbeat_s": 0.1, "max_chunk_size": 1 << 20,
            "targets": [{"id": 10 + i, "path": str(tmp_path / f"t{i}"),
                         "capacity": capacities[i - 1] if capacities else capacity}],
            **node_cfg}).start())
    rc = rpc.Client(SECRET)
    end = time.time() + 20
    while time.time() < end:
        st = rc.call(m_addr, "status")[0]["routing"]
        if sum(n["alive"] for n in st["nodes"].values()) == 3 and all(
                len(n.routing.raw["nodes"]) == 3 for n in nodes):
            break
        time.sleep(0.05)
    sc = StorageClient(rc, MgmtdClient([m_addr], rc), deadline_s=20)
    return mg, nodes, sc, rc


@pytest.fixture
def craq(tmp_path):
    mg, nodes, sc, rc = make_cluster(tmp_path)
    yield mg, nodes, sc, rc
    for n in nodes:
        n.stop()
    mg.stop()
    rc.close()


def replica_metas(nodes, cid):
    return [n.engines[10 + i].meta(cid) for i, n in enumerate(nodes, 1)]


def direct_read(rc, node, chain, cid, off=0, n=1 << 20):
    return rc.call(node.addr, "read", {"chain": 1, "chain_ver": chain["ver"], "chunk": cid.hex(),
                                       "offset": off, "length": n})


def test_write_replicates_and_reads_from_any_replica(craq):
    mg, nodes, sc, rc = craq
    rng = random.Random(7)
    cid = chunk_id(42, 0)
    model = bytearray()
    for _ in range(12):
        off, n = rng.randrange(0, 200_000), rng.randrange(1, 100_000)
        data = rng.randbytes(n)
        sc.write_chunk(1, cid, off, data)
        if len(model) < off + n:
            model.extend(b"\0" * (off + n - len(model)))
        model[off:off + n] = data
    ms = replica_metas(nodes, cid)
    assert all(m == ms[0] for m in ms) and ms[0]["pending_ver"] == 0
    assert ms[0]["committed_ver"] == 12 and ms[0]["size"] == len(model)
    chain = sc.routing.chain(1)
    for n in nodes:
        res, d = direct_read(rc, n, chain, cid)
        assert bytes(d) == bytes(model) and res["ver"] == 12
    assert sc.read_chunk(1, cid, 1000, 5000) == bytes(model[1000:6000])


def test_pending_version_is_not_committed_and_tail_serves(craq):
    mg, nodes, sc, rc = craq
    cid = chunk_id(43, 1)
    sc.write_chunk(1, cid, 0, b"A" * 1000)
    chain = sc.routing.chain(1)
    head, tail = nodes[0], nodes[2]
    head.engines[11].update(cid, 2, chain["ver"], 0, b"B" * 10)  # a write in flight at the head
    with pytest.raises(rpc.RpcError) as ei:
        direct_read(rc, head, chain, cid)
    assert ei.value.code == "NOT_COMMITTED"
    assert bytes(direct_read(rc, tail, chain, cid)[1]) == b"A" * 1000
    for _ in range(20):  # the client falls back to the tail
        assert sc.read_chunk(1, cid, 0, 1000) == b"A" * 1000
    # the next write resolves it: head bases v3 on its pending v2; successors lack v2 and get a
    # full-chunk replace, so all replicas end identical
    sc.write_chunk(1, cid, 500, b"C" * 10)
    want = b"B" * 10 + b"A" * 490 + b"C" * 10 + b"A" * 490
    ms = replica_metas(nodes, cid)
    assert all(m == ms[0] for m in ms) and ms[0]["committed_ver"] == 3
    assert sc.read_chunk(1, cid, 0, 1000) == want


def test_chain_version_is_checked(craq):
    mg, nodes, sc, rc = craq
    cid = chunk_id(44, 0)
    sc.write_chunk(1, cid, 0, b"x" * 10)
    chain = sc.routing.chain(1)
    for n in nodes:
        with pytest.raises(rpc.RpcError) as ei:
            rc.call(n.addr, "read", {"chain": 1, "chain_ver": chain["ver"] - 1, "chunk": cid.hex(),
                                     "offset": 0, "length": 10})
        assert ei.value.code == "CHAIN_VERSION"
    with pytest.raises(rpc.RpcError) as ei:
        rc.call(nodes[0].addr, "write", {"chain": 1, "chain_ver": chain["ver"] + 5,
                                         "chunk": cid.hex(), "offset": 0}, b"y")
    assert ei.value.code == "CHAIN_VERSION"
    with pytest.raises(rpc.RpcError) as ei:  # writes enter at the head only
        rc.call(nodes[1].addr, "write", {"chain": 1, "chain_ver": chain["ver"],
                                         "chunk": cid.hex(), "offset": 0}, b"y")
    assert ei.value.code == "NOT_HEAD"


def test_missed_update_gets_full_chunk_replace(craq):
    mg, nodes, sc, rc = craq
    cid = chunk_id(45, 0)
    sc.write_chunk(1, cid, 0, os.urandom(300_000))
    nodes[1].engines[12].remove(cid)  # the middle lost the chunk
    sc.write_chunk(1, cid, 100, b"z" * 50)
    ms = replica_metas(nodes, cid)
    assert all(m == ms[0] for m in ms)


def test_flipped_byte_detected_served_and_repaired(craq):
    mg, nodes, sc, rc = craq
    cid = chunk_id(46, 0)
    data = os.urandom(200_000)
    sc.write_chunk(1, cid, 0, data)
    path = nodes[1].engines[12].chunk_path(cid)
    with open(path, "r+b") as f:
        f.seek(64 + 777)
        b = f.read(1)
        f.seek(64 + 777)
        f.write(bytes([b[0] ^ 0xFF]))
    chain = sc.routing.chain(1)
    res, d = direct_read(rc, nodes[1], chain, cid, 700, 200)
    assert bytes(d) == data[700:900]
    assert nodes[1].stats["repairs"] == 1
    assert nodes[1].engines[12].read(cid) == data  # repaired on disk
    assert replica_metas(nodes, cid)[1] == replica_metas(nodes, cid)[0]


def test_enospc_is_clear_and_nothing_corrupted(tmp_path):
    mg, nodes, sc, rc = make_cluster(tmp_path, capacity=600_000)
    try:
        keep = os.urandom(200_000)
        sc.write_chunk(1, chunk_id(50, 0), 0, keep)
        with pytest.raises(OSError) as ei:
            for i in range(1, 10):
                sc.write_chunk(1, chunk_id(50, i), 0, os.urandom(200_000))
        assert ei.value.errno == 28
        assert sc.read_chunk(1, chunk_id(50, 0), 0, 1 << 20) == keep
        for i in range(1, 10):
            ms = replica_metas(nodes, chunk_id(50, i))
            assert all(m == ms[0] for m in ms)  # no replica holds a half-applied write
            assert ms[0] is None or ms[0]["pending_ver"] == 0
    finally:
        for n in nodes:
            n.stop()
        mg.stop()


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("full_target", [0, 1, 2])
def test_enospc_on_one_target_leaves_replicas_identical(tmp_path, full_target, fast_path):
    """A full-chunk write that one target of the chain cannot hold (head, middle or tail) fails with ENOSPC and
    leaves no replica holding it, pending or committed: each target takes the write's space before the bytes go
    on down the chain, and one refused downstream is dropped on the way back up. The chunk's old content stays
    readable from every target."""
    caps = [1 << 20] * 3
    caps[full_target] = 500_000
    mg, nodes, sc, rc = make_cluster(tmp_path, capacities=caps, fast_path=fast_path)
    try:
        cid, other = chunk_id(51, 0), chunk_id(51, 1)
        old = os.urandom(200_000)
        sc.write_chunk(1, cid, 0, old)
        sc.write_chunk(1, other, 0, os.urandom(200_000))
        for _ in range(3):  # (retried: the same refusal each time)
            with pytest.raises(OSError) as ei:
                sc.write_chunk(1, cid, 0, os.urandom(300_000))  # 200 + 200 + 300 KB > 500 KB on one target
            assert ei.value.errno == 28
        ms = replica_metas(nodes, cid)
        assert all(m == ms[0] for m in ms), ms
        assert ms[0]["pending_ver"] == 0 and ms[0]["committed_ver"] == 1
        chain = sc.routing.chain(1)
        for n in nodes:
            assert bytes(direct_read(rc, n, chain, cid)[1]) == old
        used = [n.engines[10 + i].used_bytes() for i, n in enumerate(nodes, 1)]
        assert used == [used[0]] * 3  # no space left taken by a reservation or a dropped version
    finally:
        for n in nodes:
            n.stop()
        mg.stop()
        rc.close()


def test_zero_copy_reads_checked_by_client_and_repaired(craq):
    """Zero-copy reads (sendfile, CRC32C checked by the client): a byte flipped on one replica's
    disk is detected by the client, read again through that replica's verifying path, which
    serves the right bytes from another replica and repairs its copy; the data is never wrong."""
    mg, nodes, sc, rc = craq
    assert sc.zero_copy
    cid = chunk_id(47, 0)
    data = os.urandom(1 << 20)
    sc.write_chunk(1, cid, 0, data)
    chain = sc.routing.chain(1)
    res, d = rc.call(nodes[1].addr, "read", {"chain": 1, "chain_ver": chain["ver"],
                                             "chunk": cid.hex(), "offset": 0, "length": 1 << 20,
                                             "zc": True})
    assert bytes(d) == data and res["ver"] == 1
    path = nodes[1].engines[12].chunk_path(cid)
    with open(path, "r+b") as f:
        f.seek(64 + 5000)
        b = f.read(1)
        f.seek(64 + 5000)
        f.write(bytes([b[0] ^ 0x40]))
    with pytest.raises(rpc.RpcError) as ei:  # the replica sends it unverified; the CRC catches it
        rc.call(nodes[1].addr, "read", {"chain": 1, "chain_ver": chain["ver"], "chunk": cid.hex(),
                                        "offset": 4096, "length": 8192, "zc": True})
    assert ei.value.code == "CHECKSUM"
    buf = bytearray(1 << 20)
    for _ in range(60):  # replicas are picked at random; go on until the bad one was hit
        buf[:] = b"\0" * len(buf)
        assert sc.read_chunk(1, cid, 0, 1 << 20, into=buf) == 1 << 20 and buf == data
        if nodes[1].stats["repairs"]:
            break
    assert nodes[1].stats["repairs"] == 1 and sc.stats["crc_retries"] >= 1
    assert nodes[1].engines[12].read(cid) == data
    assert replica_metas(nodes, cid)[1] == replica_metas(nodes, cid)[0]
