"""Fault tests with real processes and kill -9 (bounded time)."""
import os
import signal
import time

import pytest

from threefs import faults, rpc
from threefs.cluster import LocalCluster


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(str(tmp_path / "c"), storage_nodes=3, replicas=3, mgmtd=2, meta=2,
                     chunk_size=256 * 1024, heartbeat_timeout_s=1.5).start()
    yield c
    c.stop()


def test_kill_head_middle_tail_loses_no_acknowledged_write(cluster):
    s = faults.run_campaign(cluster, pause_s=1.0, log=lambda *a: None)
    print("fault summary:", s)
    assert s["faults"] == 3 and s["nodes_seen_offline_syncing_serving"] == 3
    assert s["acked_writes_lost"] == 0
    assert s["writes_acked"] > 50 and s["reads_ok"] > 50
    assert s["reads_bad"] == 0 and s["reads_failed"] == 0
    assert s["replicas_identical"]


def test_meta_and_mgmtd_failover_and_corruption(cluster, tmp_path):
    fs = cluster.client(uid=0, gid=0, deadline_s=30)
    try:
        with fs.open("/x", "wb") as f:
            f.write(b"before")
        # kill a meta instance: namespace operations continue on the other one
        cluster.kill("meta1")
        for i in range(10):
            fs.mkdir(f"/d{i}")
            assert fs.stat(f"/d{i}")["type"] == "d"
        # kill the primary mgmtd: the standby takes over when the lease lapses
        st = cluster.status()
        primary = next(k for k, p in cluster.procs.items() if p["addr"] == st["primary"])
        cluster.kill(primary)
        end = time.time() + 20
        new = None
        while time.time() < end:
            new = cluster.status()
            if new and new["primary"] != st["primary"]:
                break
            time.sleep(0.1)
        assert new and new["primary"] != st["primary"]
        cluster.wait_serving(30)
        with fs.open("/y", "wb") as f:
            f.write(b"after failover")
        assert fs.pread("/y", 100, 0) == b"after failover"
        # the new primary still manages chains: a storage node dies and comes back
        pushes, refreshes = fs.storage.stats["pushes"], fs.storage.stats["refreshes"]
        cluster.kill("s2")
        assert faults.wait_state(cluster, "s2", ("offline",), 20)
        # the client learns it without asking: mgmtd pushes routing changes (long poll)
        end = time.time() + 10
        while time.time() < end and not all(
                t["state"] == "offline" for c in fs.storage.routing.chains.values()
                for t in c["targets"] if fs.storage.routing.node_of(t["id"]) == "s2"):
            time.sleep(0.05)
        assert fs.storage.stats["pushes"] > pushes
        assert fs.storage.stats["refreshes"] == refreshes
        with fs.open("/z", "wb") as f:
            f.write(b"while s2 is down")
        cluster.start_process("s2")
        cluster.wait_serving(40)
        assert fs.pread("/z", 100, 0) == b"while s2 is down"
        assert faults.replicas_identical(cluster)
        # flip a byte in a chunk file on disk: detected, served from another replica, repaired
        data = os.urandom(200_000)
        with fs.open("/flip", "wb") as f:
            f.write(data)
        ino = fs.stat("/flip")
        chain = ino["layout"]["chains"][0]
        cid = ino["id"].to_bytes(8, "big") + (0).to_bytes(4, "big")
        from threefs.chunk import ChunkEngine
        path = None
        for root, _, files in os.walk(cluster.root + "/data"):
            for n in files:
                if n == cid.hex() + ".c":
                    path = os.path.join(root, n)
                    break
            if path:
                break
        with open(path, "r+b") as f:
            f.seek(64 + 4321)
            b = f.read(1)
            f.seek(64 + 4321)
            f.write(bytes([b[0] ^ 0x10]))
        node = path.split("/data/")[1].split("/")[0]
        rc = cluster.rpc_client()
        st = cluster.status()
        cver = next(c["ver"] for c in st["chains"] if c["id"] == chain)
        res, d = rc.call(cluster.procs[node]["addr"], "read",
                         {"chain": chain, "chain_ver": cver, "chunk": cid.hex(), "offset": 0,
                          "length": 1 << 20})
        assert bytes(d) == data[:256 * 1024] or bytes(d) == data
        with open(path, "rb") as f:
            f.seek(64)
            assert f.read(len(d)) == bytes(d)  # repaired on disk
        assert fs.pread("/flip", len(data), 0) == data
        rc.close()
    finally:
        fs.close()


def test_fill_disk_gives_enospc_and_corrupts_nothing(tmp_path):
    with LocalCluster(str(tmp_path / "full"), 3, 3, chains=1, capacity=3 * 1024 * 1024) as c:
        fs = c.client(uid=0, gid=0, deadline_s=20)
        keep = os.urandom(1_000_000)
        with fs.open("/keep", "wb") as f:
            f.write(keep)
        with pytest.raises(OSError) as ei:
            with fs.open("/fill", "wb") as f:
                for i in range(10):
                    f.write(os.urandom(1 << 20))
        assert ei.value.errno == 28  # ENOSPC, reported as such
        assert fs.pread("/keep", len(keep), 0) == keep
        assert faults.replicas_identical(c)
        fs.remove("/fill")  # space comes back after garbage collection
        end = time.time() + 20
        while True:
            try:
                with fs.open("/again", "wb") as f:
                    f.write(os.urandom(1 << 20))
                break
            except OSError:
                assert time.time() < end
                time.sleep(0.2)
        fs.close()


def test_a_service_that_dies_is_reported_at_once_with_its_log(tmp_path):
    """A service that exits on its own makes the cluster's waits fail at once, naming it and
    quoting its log, instead of timing out on chains that can never serve."""
    with LocalCluster(str(tmp_path / "dead"), 3, 3, chains=1) as c:
        os.kill(c.procs["s2"]["pid"], signal.SIGKILL)  # behind the cluster's back
        c.procs["s2"]["proc"].wait(timeout=10)
        t0 = time.time()
        with pytest.raises(RuntimeError, match=r"s2 \(storage, 127\.0\.0\.1:\d+\) exited") as ei:
            c.wait_serving(timeout=60)
        assert time.time() - t0 < 10
        assert "listening on" in str(ei.value)  # the tail of s2's log


def test_free_ports_are_distinct_and_outside_the_ephemeral_range():
    from threefs.cluster import free_port
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        lo = int(f.read().split()[0])
    if lo <= 2048:
        pytest.skip(f"no room below this host's ephemeral port range (it starts at {lo})")
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p < lo for p in ports)


def test_crashed_client_sessions_expire(tmp_path):
    import subprocess
    import sys
    with LocalCluster(str(tmp_path / "sess"), 3, 3, session_timeout_s=1.5) as c:
        fs = c.client(uid=0, gid=0, deadline_s=20)
        prog = f"""
import os, threefs
fs = threefs.Client({c.mgmtd_addrs!r}, {c.secret!r}, uid=0, gid=0)
a = fs.open("/crashlen", "wb"); a.pwrite(b"x" * 1_500_000, 0)  # acknowledged (File.write
b = fs.open("/orphan", "wb"); b.pwrite(os.urandom(2_500_000), 0)  # is write-behind)
print("ready", flush=True)
import time; time.sleep(3)  # the renewer keeps both sessions alive meanwhile
os.kill(os.getpid(), 9)     # crash without closing
"""
        p = subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"ready"
        ino = fs.stat("/orphan")
        fs.remove("/orphan")  # unlinked while the crashed client still has it open
        time.sleep(2.5)
        assert fs.stat("/crashlen")["size"] == 0  # sessions still renewed: length not settled
        p.wait(timeout=20)
        rc = c.rpc_client()

        def chunks():
            n = 0
            for name, pr in c.procs.items():
                if pr["service"] == "storage":
                    for ch in ino["layout"]["chains"]:
                        res, _ = rc.call(pr["addr"], "meta_list",
                                         {"chain": ch, "prefix": ino["id"].to_bytes(8, "big").hex()})
                        n += len(res["chunks"])
            return n
        assert chunks() > 0
        end = time.time() + 20
        while (chunks() or fs.stat("/crashlen")["size"] != 1_500_000) and time.time() < end:
            time.sleep(0.2)
        assert chunks() == 0  # the expired session let garbage collection run
        assert fs.stat("/crashlen")["size"] == 1_500_000  # length settled from the storage
        rc.close()
        fs.close()


def test_all_replicas_down_lastsrv_comes_back_first(tmp_path):
    """Kill every storage node under load (s1 last): s1's targets become lastsrv; s2 and s3
    come back first and must wait (never serve stale data); once s1 is back the chains serve
    again, the others sync, and no acknowledged write is lost."""
    import threading
    with LocalCluster(str(tmp_path / "all"), 3, 3, chunk_size=256 * 1024,
                      heartbeat_timeout_s=1.5) as c:
        fs = c.client(uid=0, gid=0, deadline_s=60)
        ck = faults.Checker(fs, files=2, seed=1)
        ck.setup()
        ths = [threading.Thread(target=ck.writer, args=(i,), daemon=True) for i in range(2)]
        ths += [threading.Thread(target=ck.reader, args=(i,), daemon=True) for i in range(1)]
        for t in ths:
            t.start()
        try:
            time.sleep(1)
            for n in ("s3", "s2", "s1"):
                c.kill(n)
                assert faults.wait_state(c, n, ("offline", "lastsrv"), 30)
            st = c.status()
            assert all([t["state"] for t in ch["targets"]] == ["lastsrv", "offline", "offline"]
                       for ch in st["chains"])
            acked_before = ck.stats["writes_acked"]
            c.start_process("s2")
            c.start_process("s3")
            assert faults.wait_state(c, "s2", ("waiting",), 20)
            assert faults.wait_state(c, "s3", ("waiting",), 20)
            time.sleep(1)
            assert ck.stats["writes_acked"] == acked_before  # nothing serves without s1
            c.start_process("s1")
            c.wait_serving(60)
            time.sleep(1)
        finally:
            ck.stop.set()
            for t in ths:
                t.join(90)
        assert ck.stats["writes_acked"] > acked_before
        assert ck.verify() == 0 and ck.stats["reads_bad"] == 0
        for f in ck.handles.values():
            f.close()
        assert faults.replicas_identical(c)
        fs.close()


def test_write_behind_stream_survives_a_killed_head(cluster):
    """A File.write stream (write-behind, several chunk writes in flight) while the head of a
    chain is killed: writes in flight fail over and are retried, close() returns only when
    all are acknowledged, and the file reads back intact; the node comes back identical."""
    fs = cluster.client(uid=0, gid=0, deadline_s=30, write_window=4)
    try:
        cs = 256 * 1024
        data = os.urandom(cs * 40 + 12345)
        victim = "s1"  # the head of one of the chains the file is striped over
        assert victim in cluster.procs
        with fs.open("/wbk", "wb") as f:
            for i in range(0, len(data), cs // 2):
                if i == cs * 10:
                    cluster.kill(victim)
                f.write(data[i:i + cs // 2])
        assert fs.pread("/wbk", len(data) + 1, 0) == data
        cluster.start_process(victim)
        cluster.wait_serving(40)
        assert fs.pread("/wbk", len(data) + 1, 0) == data
        assert faults.replicas_identical(cluster)
    finally:
        fs.close()
