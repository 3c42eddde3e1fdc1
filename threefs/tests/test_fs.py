"""Client, meta and CLI against a real local cluster (processes on 127.0.0.1)."""
import errno
import io
import os
import random
import socket
import subprocess
import sys
import time

import pytest

import threefs
from threefs import rpc
from threefs.cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("fs")), storage_nodes=3, replicas=3).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def fs(cluster):
    cl = cluster.client(uid=0, gid=0)
    yield cl
    cl.close()


def test_file_roundtrip_across_chunks_and_stripes(fs):
    fs.mkdir("/small", chunk_size=64 * 1024, stripe=3)
    rng = random.Random(11)
    for n in (0, 1, 65535, 65536, 65537, 300_001):
        data = rng.randbytes(n)
        with fs.open(f"/small/f{n}", "wb") as f:
            assert f.write(data) == n
        assert fs.stat(f"/small/f{n}")["size"] == n
        with fs.open(f"/small/f{n}", "rb") as f:
            assert f.read() == data
        assert fs.pread(f"/small/f{n}", 1000, max(0, n - 500)) == data[max(0, n - 500):]
    lay = fs.stat("/small/f300001")["layout"]
    assert lay["chunk_size"] == 65536 and len(lay["chains"]) == 3


def test_file_object_api(fs):
    with fs.open("/obj.bin", "w+b") as f:
        assert isinstance(f, io.RawIOBase) and f.readable() and f.writable()
        f.write(b"hello world")
        assert f.tell() == 11
        f.seek(6)
        assert f.read(5) == b"world"
        f.seek(-5, 2)
        buf = bytearray(5)
        assert f.readinto(buf) == 5 and buf == b"world"
        f.seek(0)
        f.write(b"J")
        f.truncate(5)
        f.seek(0)
        assert f.read() == b"Jello"
        f.flush()
    with fs.open("/obj.bin", "ab") as f:
        f.write(b"!!")
    with fs.open("/obj.bin", "rb") as f:
        assert f.read() == b"Jello!!"
        with pytest.raises(io.UnsupportedOperation):
            f.write(b"x")
    with pytest.raises(ValueError):
        f.read()
    with pytest.raises(FileExistsError):
        fs.open("/obj.bin", "xb")
    with pytest.raises(ValueError, match="mode"):
        fs.open("/obj.bin", "rw")
    # buffered wrappers work on top of the raw file
    with io.BufferedReader(fs.open("/obj.bin", "rb")) as br:
        assert br.read(3) == b"Jel"


def test_pwrite_pread_batch_and_sparse(fs):
    with fs.open("/sparse", "wb") as f:
        f.pwrite(b"end", 3_000_000)
        f.pwrite(b"start", 0)
    assert fs.stat("/sparse")["size"] == 3_000_003
    got = fs.read_batch([("/sparse", 0, 5), ("/sparse", 3_000_000, 10), ("/sparse", 1000, 4)])
    assert got == [b"start", b"end", b"\0" * 4]
    fs.truncate("/sparse", 4)
    assert fs.stat("/sparse")["size"] == 4 and fs.pread("/sparse", 100, 0) == b"star"
    fs.truncate("/sparse", 10)  # extend: zeros
    assert fs.pread("/sparse", 100, 0) == b"star" + b"\0" * 6


def test_namespace_ops(fs):
    fs.makedirs("/ns/a/b")
    for i in range(23):
        with fs.open(f"/ns/a/f{i:02d}", "wb") as f:
            f.write(str(i).encode())
    names = fs.listdir("/ns/a", page_size=5)
    assert names == sorted(["b"] + [f"f{i:02d}" for i in range(23)])
    fs.rename("/ns/a/f00", "/ns/a/b/moved")
    assert fs.pread("/ns/a/b/moved", 10, 0) == b"0" and not fs.exists("/ns/a/f00")
    fs.rename("/ns/a/f01", "/ns/a/f02")  # overwrite
    assert fs.pread("/ns/a/f02", 10, 0) == b"1"
    with pytest.raises(OSError) as ei:
        fs.rename("/ns/a", "/ns/a/b/inside")  # ancestor loop
    assert ei.value.errno == errno.EINVAL
    fs.rename("/ns/a/b", "/ns/b2")
    assert fs.listdir("/ns") == ["a", "b2"] and fs.stat("/ns/a")["nlink"] == 2
    fs.link("/ns/a/f03", "/ns/hard")
    assert fs.stat("/ns/hard")["nlink"] == 2
    fs.remove("/ns/a/f03")
    assert fs.pread("/ns/hard", 10, 0) == b"3" and fs.stat("/ns/hard")["nlink"] == 1
    fs.symlink("/ns/hard", "/ns/sym")
    fs.symlink("a/f04", "/ns/rel")
    assert fs.readlink("/ns/sym") == "/ns/hard"
    assert fs.pread("/ns/sym", 10, 0) == b"3" and fs.pread("/ns/rel", 10, 0) == b"4"
    assert fs.stat("/ns/sym", follow_symlinks=False)["type"] == "l"
    fs.symlink("/ns/loop2", "/ns/loop1")
    fs.symlink("/ns/loop1", "/ns/loop2")
    with pytest.raises(OSError) as ei:
        fs.stat("/ns/loop1")
    assert ei.value.errno == errno.ELOOP
    with pytest.raises(OSError) as ei:
        fs.rmdir("/ns/a")
    assert ei.value.errno == errno.ENOTEMPTY
    with pytest.raises(FileNotFoundError):
        fs.stat("/ns/nope")
    with pytest.raises(NotADirectoryError):
        fs.listdir("/ns/hard")
    fs.utime("/ns/hard", 1000.0, 2000.0)
    assert fs.stat("/ns/hard")["mtime"] == 2000.0
    st = fs.statfs()
    assert st["total"] > 0 and st["chains"] == 3


def test_unlink_garbage_collects_chunks(fs, cluster):
    with fs.open("/gc.bin", "wb") as f:
        f.write(os.urandom(2_500_000))
    ino = fs.stat("/gc.bin")
    rc = cluster.rpc_client()

    def chunks():
        n = 0
        for name, p in cluster.procs.items():
            if p["service"] != "storage":
                continue
            for c in ino["layout"]["chains"]:
                try:
                    res, _ = rc.call(p["addr"], "meta_list",
                                     {"chain": c, "prefix": ino["id"].to_bytes(8, "big").hex()})
                    n += len(res["chunks"])
                except rpc.RpcError:
                    pass
        return n
    assert chunks() == 3 * 3  # 3 chunks x 3 replicas
    fs.remove("/gc.bin")
    end = time.time() + 20
    while chunks() and time.time() < end:
        time.sleep(0.1)
    assert chunks() == 0
    rc.close()


def test_permissions(cluster, fs):
    fs.mkdir("/home", 0o755)
    fs.mkdir("/home/alice", 0o700)
    fs.chown("/home/alice", 1000, 1000)
    alice = cluster.client(uid=1000, gid=1000)
    bob = cluster.client(uid=1001, gid=1001)
    try:
        with alice.open("/home/alice/secret", "wb") as f:
            f.write(b"mine")
        alice.chmod("/home/alice/secret", 0o600)
        with pytest.raises(PermissionError):
            bob.listdir("/home/alice")
        with pytest.raises(PermissionError):
            bob.open("/home/alice/secret", "rb")
        alice.chmod("/home/alice", 0o755)
        with pytest.raises(PermissionError):
            bob.open("/home/alice/secret", "rb")  # 0600
        with pytest.raises(PermissionError):
            bob.open("/home/alice/new", "wb")  # no write on the directory
        with pytest.raises(PermissionError):
            bob.chmod("/home/alice/secret", 0o777)  # EPERM: not the owner
        with pytest.raises(PermissionError):
            bob.chown("/home/alice/secret", 1001, 1001)
        alice.chmod("/home/alice/secret", 0o644)
        with bob.open("/home/alice/secret", "rb") as f:
            assert f.read() == b"mine"
        with pytest.raises(PermissionError):
            bob.open("/home/alice/secret", "r+b")
        with pytest.raises(PermissionError):
            bob.remove("/home/alice/secret")
    finally:
        alice.close()
        bob.close()


def test_bad_input(fs):
    with pytest.raises(TypeError, match="path"):
        fs.stat(b"/x")
    with pytest.raises(ValueError, match="absolute"):
        fs.stat("relative/x")
    with pytest.raises(OSError) as ei:
        fs.open("/" + "n" * 256, "wb")
    assert ei.value.errno == errno.ENAMETOOLONG
    with pytest.raises(OSError) as ei:
        with fs.open("/big", "wb") as f:
            f.pwrite(b"x", (1 << 40))
    assert ei.value.errno == errno.EFBIG
    with pytest.raises(OSError) as ei:
        fs.truncate("/big", (1 << 40) + 1)
    assert ei.value.errno == errno.EFBIG
    with pytest.raises(ValueError):
        fs.truncate("/big", -1)
    # stale handles: the file is removed and collected while a writer still has it open
    f = fs.open("/stale", "wb")
    f.write(b"abc")
    fs._meta("close", inode=f.attrs["id"], session=f.session)  # session ended elsewhere
    fs.remove("/stale")
    with pytest.raises(OSError) as ei:
        f.flush()
    assert ei.value.errno in (errno.ESTALE, errno.EBADF)
    with pytest.raises(OSError) as ei:
        fs._meta("close", inode=987654321, session="00")
    assert ei.value.errno == errno.ESTALE


def test_no_secret_no_access(cluster):
    with pytest.raises(rpc.AuthError):
        threefs.Client(cluster.mgmtd_addrs, "not-the-cluster-secret", deadline_s=5)
    meta_addr = cluster.procs["meta1"]["addr"]
    for name in ("meta1", "s1", "mgmtd1"):
        with pytest.raises(rpc.AuthError):
            rpc.Client("wrong-secret-123").call(cluster.procs[name]["addr"], "stat",
                                                {"path": "/"})


def test_storage_decoder_fuzz_keeps_serving(cluster, fs):
    rng = random.Random(9)
    for name in ("s1", "meta1"):
        host, port = rpc.parse_addr(cluster.procs[name]["addr"])
        for _ in range(40):
            s = socket.create_connection((host, port), timeout=5)
            try:
                s.sendall(rng.randbytes(rng.randrange(1, 2000)))
                s.shutdown(socket.SHUT_WR)
                s.recv(100)
            except OSError:
                pass
            s.close()
    with fs.open("/after-fuzz", "wb") as f:
        f.write(b"ok")
    assert fs.pread("/after-fuzz", 2, 0) == b"ok"


def test_cli(cluster, tmp_path):
    env = {**os.environ, "THREEFS_CLUSTER": cluster.root}
    src = tmp_path / "in.bin"
    src.write_bytes(os.urandom(1_500_000))

    def run(*a):
        r = subprocess.run([sys.executable, "-m", "threefs", *a], env=env, capture_output=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr.decode()
        return r.stdout
    run("mkdir", "/cli")
    run("put", str(src), "/cli/a.bin")
    run("cp", "/cli/a.bin", "/cli/b.bin")
    run("get", "/cli/b.bin", str(tmp_path / "out.bin"))
    assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()
    assert run("cat", "/cli/a.bin") == src.read_bytes()
    assert b"a.bin" in run("ls", "/cli")
    assert b'"size": 1500000' in run("stat", "/cli/b.bin")
    run("rm", "/cli/a.bin")
    assert b"a.bin" not in run("ls", "/cli")
    out = run("status").decode()
    assert "chain" in out and "serving" in out and "storage" in out


def test_read_batch_matches_pread(fs):
    rng = random.Random(21)
    fs.mkdir("/batch", chunk_size=64 * 1024)
    blobs = {}
    for i in range(3):
        blobs[f"/batch/f{i}"] = rng.randbytes(rng.randrange(100_000, 400_000))
        with fs.open(f"/batch/f{i}", "wb") as f:
            f.write(blobs[f"/batch/f{i}"])
    reqs = []
    for _ in range(40):
        p = rng.choice(sorted(blobs))
        off = rng.randrange(len(blobs[p]) + 10)
        reqs.append((p, off, rng.randrange(0, 150_000)))
    got = fs.read_batch(reqs)
    assert got == [blobs[p][off:off + n] for p, off, n in reqs]
    with pytest.raises(ValueError):
        fs.read_batch([("/batch/f0", -1, 5)])


def test_sequential_readahead_matches_data(fs):
    """Read-only files prefetch the next block of a sequential read; the bytes must equal
    the written ones whatever the block size, after seeks (stale readahead dropped), at the
    end of the file and in holes, and with readahead off."""
    fs.mkdir("/ra", chunk_size=256 * 1024, stripe=3)
    rng = random.Random()
    n = 256 * 1024 * 5 + rng.randrange(1, 100_000)
    data = bytearray(rng.randbytes(n))
    data[300_000:400_000] = bytes(100_000)
    with fs.open("/ra/f", "wb") as f:
        f.pwrite(data[:300_000], 0)
        f.pwrite(data[400_000:], 400_000)  # a hole in between reads as zeros
    for ra in (2, 0, 5):
        fs.readahead = ra
        for block in (64 * 1024, 100_000, 256 * 1024):
            with fs.open("/ra/f", "rb") as f:
                out, buf = bytearray(), bytearray(block)
                while True:
                    buf[:] = b"\xaa" * block  # poison
                    k = f.readinto(buf)
                    if not k:
                        break
                    out += buf[:k]
                    if rng.random() < 0.2:  # jump: the prefetched block is not the one read
                        pos = rng.randrange(n)
                        f.seek(pos)
                        out = bytearray(data[:pos])
                assert out == data, (ra, block)
    fs.readahead = 2
    with fs.open("/ra/f", "rb") as f:  # read the first block, then rewrite the second via
        assert f.read(256 * 1024) == data[:256 * 1024]  # another handle: a new read after
        f.seek(0)  # a seek does not use the stale prefetch
        new = rng.randbytes(256 * 1024)
        fs.pwrite("/ra/f", new, 256 * 1024)
        f.seek(256 * 1024)
        assert f.read(256 * 1024) == new


def test_write_behind_matches_model(fs):
    """File.write keeps up to write_window chunk writes in flight: whatever the sizes, seeks,
    reuse of the caller's buffer right after write() and reads in between, the file must equal
    a plain-Python model, with the window on or off."""
    fs.mkdir("/wb", chunk_size=64 * 1024, stripe=3)
    rng = random.Random()
    for window in (4, 1, 0):
        fs.write_window = window
        model = bytearray()
        buf = bytearray(300_000)
        with fs.open(f"/wb/f{window}", "w+b") as f:
            for step in range(40):
                if rng.random() < 0.2:
                    f.seek(rng.randrange(len(model) + 1))
                n = rng.choice([1, 100, 4096, 65536, 65537, 200_000])
                data = rng.randbytes(n)
                buf[:n] = data
                pos = f.tell()
                assert f.write(memoryview(buf)[:n]) == n
                buf[:n] = b"\xee" * n  # the caller reuses its buffer at once
                if len(model) < pos + n:
                    model.extend(bytes(pos + n - len(model)))
                model[pos:pos + n] = data
                if step % 13 == 12:  # read-your-writes on the same handle
                    p = rng.randrange(len(model))
                    assert f.pread(5000, p) == bytes(model[p:p + 5000])
        assert fs.pread(f"/wb/f{window}", len(model) + 10, 0) == bytes(model)
    fs.write_window = 4


def test_preconnect_pools_connections_and_arguments_are_checked(cluster):
    """Client(preconnect=n) opens n authenticated connections to every live storage node in the
    background; bad values of the new data-path options raise ValueError naming them."""
    c = cluster.client(uid=0, gid=0, preconnect=2)
    try:
        storage = sorted(n["addr"] for n in c.storage.routing.raw["nodes"].values()
                         if n["type"] == "storage" and n["alive"])
        assert len(storage) == 3
        end = time.time() + 10
        while time.time() < end and not all(len(c.rpc._pool.get(a, [])) >= 2 for a in storage):
            time.sleep(0.02)
        assert all(len(c.rpc._pool.get(a, [])) >= 2 for a in storage)
        with c.open("/pre", "wb") as f:
            f.write(b"p" * 100)
        assert c.pread("/pre", 200, 0) == b"p" * 100
    finally:
        c.close()
    for kw in ({"preconnect": -1}, {"preconnect": 17}, {"write_window": 65},
               {"write_window": True}, {"readahead": 99}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            cluster.client(uid=0, gid=0, **kw)


def read_poisoned(f, bufsize: int) -> bytearray:
    """The rest of file object f, by readinto calls into one buffer of bufsize bytes refilled with
    0xAA before each call (a short or stale fill shows in the result)."""
    out, buf = bytearray(), bytearray(bufsize)
    while True:
        buf[:] = b"\xaa" * bufsize
        k = f.readinto(buf)
        if not k:
            return out
        out += buf[:k]


def test_short_circuit_sequential_reads_batched_and_opt_out(cluster):
    """The storage nodes run on this host: a sequential read goes short-circuit, its readahead
    several blocks per request; with short_circuit=False the same bytes come over TCP."""
    data = os.urandom(6 << 20)
    for sc in (True, False):
        c = cluster.client(uid=0, gid=0, short_circuit=sc)
        try:
            with c.open(f"/scseq{sc}", "wb") as f:
                f.write(data)
            with c.open(f"/scseq{sc}", "rb") as f:
                assert read_poisoned(f, 1 << 20) == data
            if sc:
                st = c.storage.sc.stats
                assert st["reads"] == 6 and st["requests"] <= 3, st
            else:
                assert c.storage.sc is None
        finally:
            c.close()


def test_short_circuit_readahead_batches_of_16(cluster):
    """A long sequential read asks for its blocks 16 ranges per request: 60 blocks in 4
    requests (10 with the batches of 6 before); the bytes are the written ones, also after a
    seek into the middle."""
    c = cluster.client(uid=0, gid=0)
    try:
        c.mkdir("/grow", chunk_size=64 * 1024, stripe=3)
        data = os.urandom(60 * 64 * 1024)
        with c.open("/grow/f", "wb") as f:
            f.write(data)
        st = c.storage.sc.stats
        r0, q0 = st["reads"], st["requests"]
        with c.open("/grow/f", "rb") as f:
            assert read_poisoned(f, 64 * 1024) == data
            assert st["reads"] - r0 == 60 and st["requests"] - q0 == 4, st
            f.seek(10 * 64 * 1024)  # the prefetched blocks are dropped; a new window starts
            q1 = st["requests"]
            buf = bytearray(b"\xaa" * 65536)
            assert f.readinto(buf) == len(buf) and buf == data[10 * 65536:11 * 65536]
            # 16 ranges, then 16 more right after the first block: 31 prefetched
            assert len(f._ra) == 31 and st["requests"] - q1 == 2
            rest = f.read()
            assert rest == data[11 * 65536:]
    finally:
        c.close()
