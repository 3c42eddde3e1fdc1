"""KV backends: SQLite (embedded) and etcd (three members on loopback)."""
import shutil
import threading
import time

import pytest

from threefs.kv import SqliteKV


def etcd_or_skip(tmp_path):
    if shutil.which("etcd") is None:
        pytest.skip("etcd not installed (apt-get install etcd-server)")
    from threefs.kv_etcd import EtcdCluster
    return EtcdCluster(str(tmp_path / "etcd")).start()


@pytest.fixture(params=["sqlite", "etcd"])
def kv(request, tmp_path):
    if request.param == "sqlite":
        yield SqliteKV(str(tmp_path / "kv.sqlite"))
        return
    ec = etcd_or_skip(tmp_path)
    from threefs.kv_etcd import EtcdKV
    try:
        yield EtcdKV(ec.endpoints)
    finally:
        ec.stop()


def test_basic_ops_and_scan(kv):
    kv.transact(lambda t: [t.put(b"D" + bytes([i]), b"v%d" % i) for i in range(10)])
    assert kv.transact(lambda t: t.get(b"D\x03")) == b"v3"
    assert kv.transact(lambda t: t.get(b"nope")) is None
    rows = kv.transact(lambda t: t.scan(b"D", start_after=b"D\x04", limit=3))
    assert rows == [(b"D\x05", b"v5"), (b"D\x06", b"v6"), (b"D\x07", b"v7")]

    def mixed(t):  # a transaction sees its own writes
        t.delete(b"D\x05")
        t.put(b"D\x0a", b"new")
        return t.scan(b"D", start_after=b"D\x04")
    assert [k for k, _ in kv.transact(mixed)] == [b"D\x06", b"D\x07", b"D\x08", b"D\x09",
                                                   b"D\x0a"]

    class Boom(Exception):
        pass

    def failing(t):
        t.put(b"D\x01", b"changed")
        raise Boom()
    with pytest.raises(Boom):
        kv.transact(failing)
    assert kv.transact(lambda t: t.get(b"D\x01")) == b"v1"  # nothing written


def test_concurrent_increments_are_serializable(kv):
    kv.transact(lambda t: t.put(b"ctr", b"0"))

    def inc(t):
        t.put(b"ctr", str(int(t.get(b"ctr")) + 1).encode())

    def worker():
        for _ in range(15):
            kv.transact(inc)
    ths = [threading.Thread(target=worker) for _ in range(4)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(60)
    assert kv.transact(lambda t: t.get(b"ctr")) == b"60"


def test_etcd_member_loss_is_survived(tmp_path):
    ec = etcd_or_skip(tmp_path)
    from threefs.kv_etcd import EtcdKV
    try:
        kv = EtcdKV(ec.endpoints)
        kv.transact(lambda t: t.put(b"a", b"1"))
        ec.kill(ec.names[0])  # kill -9 one of three members
        end = time.time() + 20
        while True:
            try:
                kv.transact(lambda t: t.put(b"b", b"2"))
                break
            except ConnectionError:
                assert time.time() < end
        assert kv.transact(lambda t: (t.get(b"a"), t.get(b"b"))) == (b"1", b"2")
    finally:
        ec.stop()


def test_cluster_on_etcd_survives_member_kill(tmp_path):
    ec = etcd_or_skip(tmp_path)
    from threefs.cluster import LocalCluster
    try:
        kv = {"backend": "etcd", "endpoints": ec.endpoints}
        with LocalCluster(str(tmp_path / "c"), 3, 3, kv=kv, meta=1) as c:
            fs = c.client(uid=0, gid=0, deadline_s=30)
            fs.mkdir("/e")
            with fs.open("/e/f", "wb") as f:
                f.write(b"on etcd")
            ec.kill(ec.names[1])
            assert fs.pread("/e/f", 100, 0) == b"on etcd"
            fs.rename("/e/f", "/e/g")
            assert fs.listdir("/e") == ["g"] and fs.stat("/e/g")["size"] == 7
            fs.close()
    finally:
        ec.stop()
