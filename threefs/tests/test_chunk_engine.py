import os
import random
import subprocess
import sys

import pytest

from threefs import ref
from threefs.chunk import ChecksumError, ChunkEngine, VersionError, chunk_id, crc32c

CS = 64 * 1024


def rnd(rng, n):
    return rng.randbytes(n)


def test_crc32c_matches_reference():
    assert crc32c(b"123456789") == 0xE3069283 == ref.crc32c(b"123456789")
    rng = random.Random(1)
    # sizes around 256 bytes: the carry-less-multiply folding path starts there
    for n in (0, 1, 7, 8, 9, 63, 64, 255, 256, 257, 511, 512, 1000, 4097, 4351, 12287, 12288,
              12289, 3 * 12288 + 5, 100_003):
        d = rnd(rng, n)
        assert crc32c(d) == ref.crc32c(d)
        # continuation
        assert crc32c(d[n // 2:], crc32c(d[: n // 2])) == ref.crc32c(d)


def test_crc32c_blocks_one_pass_matches_per_block():
    from threefs import _C
    rng = random.Random()
    for n in (0, 1, 4095, 4096, 4097, 3 * 4096, 3 * 4096 + 5, 7 * 4096 + 1, 1 << 20,
              rng.randrange(1, 300_000)):
        data = rng.randbytes(n)
        crc, blocks = _C.crc32c_blocks(data)
        assert crc == (ref.crc32c(data) if n <= 20_000 else crc32c(data))
        assert blocks == [crc32c(data[i:i + 4096]) for i in range(0, n, 4096)]


def test_random_ops_match_model(tmp_path):
    rng = random.Random(2)
    e = ChunkEngine(tmp_path, "none", max_chunk_size=CS)
    models = {}
    for step in range(300):
        cid = chunk_id(rng.randrange(3), rng.randrange(4))
        m = models.setdefault(cid, ref.ChunkModel())
        op = rng.random()
        latest = m.pending_ver or m.committed_ver
        if op < 0.55:
            off = rng.randrange(CS)
            n = rng.randrange(0, CS - off + 1) if rng.random() < 0.3 else rng.randrange(0, min(200, CS - off + 1))
            data = rnd(rng, n)
            trunc = rng.randrange(CS) if rng.random() < 0.1 else -1
            full = rng.random() < 0.1
            meta = e.update(cid, latest + 1, 7, off, data, trunc, full)
            m.update(latest + 1, off, data, trunc, full)
            assert meta["pending_ver"] == latest + 1
            assert meta["pending_size"] == len(m.pending)
            assert meta["pending_crc"] == ref.crc32c(m.pending)
        elif op < 0.9 and m.pending_ver:
            assert e.commit(cid, m.pending_ver)
            m.commit(m.pending_ver)
        else:
            off, n = rng.randrange(CS + 10), rng.randrange(CS)
            got = e.read(cid, off, n)
            if m.committed is None:
                assert got is None
            else:
                assert got == m.committed[off:off + n]
        meta = e.meta(cid)
        if meta is not None:
            assert meta["committed_ver"] == m.committed_ver
            assert meta["pending_ver"] == m.pending_ver
            if m.committed is not None:
                assert meta["size"] == len(m.committed)
                assert meta["crc"] == ref.crc32c(m.committed)
    # reopen: same metadata, same committed bytes, pending versions kept
    e2 = ChunkEngine(tmp_path, "none", max_chunk_size=CS)
    for cid, m in models.items():
        meta = e2.meta(cid)
        if m.committed is None and m.pending is None:
            continue
        assert meta["committed_ver"] == m.committed_ver and meta["pending_ver"] == m.pending_ver
        assert e2.read(cid) == (m.committed if m.committed is not None else None)
    assert e2.used_bytes() == e.used_bytes()


def test_pending_not_visible_and_version_checks(tmp_path):
    e = ChunkEngine(tmp_path, "data", max_chunk_size=CS)
    cid = chunk_id(1, 0)
    e.update(cid, 1, 1, 0, b"a" * 100)
    assert e.read(cid) is None
    e.commit(cid, 1)
    e.update(cid, 2, 1, 10, b"b" * 5)
    assert e.read(cid) == b"a" * 100  # pending v2 not visible
    with pytest.raises(VersionError):
        e.update(cid, 4, 1, 0, b"x")  # gap
    with pytest.raises(VersionError):
        e.update(cid, 2, 1, 0, b"x")  # not newer
    assert not e.commit(cid, 1)  # already committed: no-op
    with pytest.raises(VersionError):
        e.commit(cid, 3)
    e.commit(cid, 2)
    assert e.read(cid) == b"a" * 10 + b"b" * 5 + b"a" * 85
    # full replace ignores the version order (sync path)
    e.update(cid, 9, 2, 0, b"zz", full_replace=True)
    e.commit(cid, 9)
    assert e.read(cid) == b"zz" and e.meta(cid)["chain_ver"] == 2
    assert e.list(chunk_id(1, 0)[:8]) == [(cid, e.meta(cid))]
    assert e.remove(cid) and e.meta(cid) is None and e.read(cid) is None


def test_checksum_detects_flipped_byte(tmp_path):
    e = ChunkEngine(tmp_path, max_chunk_size=CS)
    cid = chunk_id(5, 3)
    data = os.urandom(5000)
    e.update(cid, 1, 1, 0, data)
    e.commit(cid, 1)
    path = e.chunk_path(cid)
    with open(path, "r+b") as f:
        f.seek(64 + 1234)
        b = f.read(1)
        f.seek(64 + 1234)
        f.write(bytes([b[0] ^ 0x40]))
    with pytest.raises(ChecksumError):
        e.read(cid, 0, 10)
    with pytest.raises(ChecksumError):
        e.read(cid)
    assert e.read(cid, 0, 10, verify=False) == data[:10]
    e.replace_committed(cid, 1, 1, data)  # repair
    assert e.read(cid) == data


def test_block_checksums_localise_corruption(tmp_path):
    e = ChunkEngine(tmp_path, max_chunk_size=CS)
    cid = chunk_id(6, 0)
    data = os.urandom(10 * 4096 + 123)
    e.update(cid, 1, 1, 0, data)
    e.commit(cid, 1)
    rng = random.Random(5)
    for _ in range(50):  # clean partial reads of any range
        off, n = rng.randrange(len(data)), rng.randrange(1, 20000)
        assert e.read(cid, off, n) == data[off:off + n]
    with open(e.chunk_path(cid), "r+b") as f:  # corrupt block 5
        f.seek(64 + 5 * 4096 + 17)
        b = f.read(1)
        f.seek(64 + 5 * 4096 + 17)
        f.write(bytes([b[0] ^ 4]))
    assert e.read(cid, 2 * 4096, 3 * 4096) == data[2 * 4096:5 * 4096]  # blocks 2-4: fine
    for off, n in ((5 * 4096, 1), (4 * 4096 + 4000, 200), (0, len(data))):
        with pytest.raises(ChecksumError):
            e.read(cid, off, n)
    with open(e.chunk_path(cid), "r+b") as f:  # corrupt the last block's table entry instead
        f.seek(64 + 5 * 4096 + 17)
        f.write(bytes([b[0]]))
        f.seek(64 + len(data) + 4 * 10)
        f.write(b"\0\0\0\0")
    assert e.read(cid, 0, 5 * 4096) == data[:5 * 4096]
    with pytest.raises(ChecksumError):
        e.read(cid, len(data) - 10, 10)


def test_capacity_enospc_keeps_data(tmp_path):
    e = ChunkEngine(tmp_path, capacity_bytes=3 * 1024, max_chunk_size=CS)
    a = chunk_id(1, 0)
    e.update(a, 1, 1, 0, b"q" * 1000)
    e.commit(a, 1)
    with pytest.raises(OSError) as ei:
        e.update(chunk_id(1, 1), 1, 1, 0, b"r" * 4000)
    assert ei.value.errno == 28
    assert e.read(a) == b"q" * 1000 and e.meta(chunk_id(1, 1)) is None
    assert not [n for _, _, fs in os.walk(tmp_path) for n in fs if n.endswith(".tmp")]


def test_reserve_takes_the_space_before_the_write(tmp_path):
    """reserve() counts a new version's bytes at once (ENOSPC when they do not fit, nothing taken), the chunk's next
    update uses them instead of taking them again, and unreserve() gives back what no update used."""
    e = ChunkEngine(tmp_path, capacity_bytes=3 * 1024, max_chunk_size=CS)
    a, b = chunk_id(2, 0), chunk_id(2, 1)
    e.reserve(a, 1000)
    held = e.used_bytes()
    assert held > 1000
    with pytest.raises(OSError) as ei:
        e.reserve(b, 2000)  # another chunk's write no longer fits beside the reservation
    assert ei.value.errno == 28 and e.used_bytes() == held
    with pytest.raises(OSError):
        e.update(b, 1, 1, 0, b"s" * 2000)
    assert e.used_bytes() == held and e.meta(b) is None
    e.update(a, 1, 1, 0, b"q" * 1000)  # takes the reserved bytes, not more
    assert e.used_bytes() == held
    e.unreserve(a)  # nothing left to give back
    assert e.used_bytes() == held
    e.reserve(b, 500)
    e.unreserve(b)  # unused: given back
    assert e.used_bytes() == held
    e.reserve(a, 1500)  # a second version of a while the first is pending: the pending one's bytes count as freed
    e.unreserve(a)
    e.commit(a, 1)
    assert e.read(a) == b"q" * 1000 and e.used_bytes() == held


def test_concurrent_replace_committed_never_overfills(tmp_path):
    """replace_committed (a sync's full-chunk copy) claims its bytes at the capacity check: of 16 threads replacing
    16 different chunks at once on a target with room for 5, at most 5 succeed, the rest get ENOSPC, and the count
    of used bytes is the files that exist (a check-then-count had let all 16 pass the check)."""
    import threading
    data = os.urandom(20_000)
    probe = ChunkEngine(tmp_path / "probe", max_chunk_size=CS)
    probe.replace_committed(chunk_id(1, 0), 1, 1, data)
    fb = probe.used_bytes()
    e = ChunkEngine(tmp_path / "t", "full", capacity_bytes=5 * fb + fb // 2, max_chunk_size=CS)
    start, ok, refused = threading.Barrier(16), [], []

    def one(i):
        start.wait()
        try:
            e.replace_committed(chunk_id(3, i), 7, 1, data)
            ok.append(i)
        except OSError as err:
            assert err.errno == 28
            refused.append(i)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ok) == 5 and len(refused) == 11, (ok, refused)
    assert e.used_bytes() == 5 * fb
    assert all(e.read(chunk_id(3, i)) == data for i in ok)
    assert all(e.meta(chunk_id(3, i)) is None for i in refused)
    assert ChunkEngine(tmp_path / "t", capacity_bytes=5 * fb + fb // 2, max_chunk_size=CS).used_bytes() == 5 * fb


@pytest.mark.parametrize("point,expect_new", [
    ("after_data_write", False), ("after_pending_rename", False),
    ("before_commit_rename", False), ("after_commit_rename", True)])
def test_crash_atomicity(tmp_path, point, expect_new):
    old, new = os.urandom(3000), os.urandom(2500)
    prog = f"""
import sys
from threefs.chunk import ChunkEngine, chunk_id
e = ChunkEngine({str(tmp_path)!r}, 'full', max_chunk_size={CS})
c = chunk_id(9, 9)
e.update(c, 1, 1, 0, {old!r}); e.commit(c, 1)
e.set_crash_point({point!r})
e.update(c, 2, 1, 100, {new!r})
e.commit(c, 2)
sys.exit(0)
"""
    r = subprocess.run([sys.executable, "-c", prog], timeout=60)
    assert r.returncode == 86
    e = ChunkEngine(tmp_path, "full", max_chunk_size=CS)
    c = chunk_id(9, 9)
    want = (old[:100] + new + old[2600:]) if expect_new else old
    assert e.read(c) == want
    m = e.meta(c)
    assert m["committed_ver"] == (2 if expect_new else 1)
    # a crash after the pending rename keeps the pending version for the chain to resolve
    assert m["pending_ver"] == (2 if point in ("after_pending_rename", "before_commit_rename")
                                else 0)
    assert not [n for _, _, fs in os.walk(tmp_path) for n in fs if n.endswith(".tmp")]


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="fsync_policy"):
        ChunkEngine(tmp_path, "sometimes")
    with pytest.raises(ValueError, match="max_chunk_size"):
        ChunkEngine(tmp_path, max_chunk_size=0)
    e = ChunkEngine(tmp_path, max_chunk_size=CS)
    with pytest.raises(TypeError, match="chunk_id"):
        e.update("abc", 1, 1, 0, b"x")
    with pytest.raises(ValueError, match="max_chunk_size"):
        e.update(chunk_id(1, 1), 1, 1, CS - 1, b"xy")
    with pytest.raises(ValueError, match="offset"):
        e.update(chunk_id(1, 1), 1, 1, -1, b"xy")
    assert e.chunk_count() == 0


def test_recycled_files_and_concurrent_reads(tmp_path):
    """Replaced chunk files are recycled (overwritten in place as later versions); readers
    running meanwhile must never see a recycled file's new bytes (no false ChecksumError),
    sizes that shrink must truncate, and reopening drops the pool."""
    import threading
    e = ChunkEngine(str(tmp_path), "none", 1 << 40, 1 << 20)
    rng = random.Random()
    ids = [bytes([i]) * 12 for i in range(4)]
    model = {}
    stop, errors = threading.Event(), []

    def reader():
        r = random.Random()
        while not stop.is_set():
            cid = r.choice(ids)
            try:
                e.read(cid)  # verified against the CRC read with the data
            except Exception as ex:  # noqa: BLE001 - any error is a failure here
                errors.append(ex)
    ts = [threading.Thread(target=reader) for _ in range(2)]
    for t in ts:
        t.start()
    try:
        for step in range(300):
            cid = rng.choice(ids)
            m = e.meta(cid)
            ver = (m["committed_ver"] if m else 0) + 1
            data = rng.randbytes(rng.choice([1, 4096, 100_000, 1 << 20]))
            e.update(cid, ver, 1, 0, data, len(data))
            e.commit(cid, ver)
            model[cid] = data
            if step % 50 == 49:
                e.remove(cid)
                del model[cid]
    finally:
        stop.set()
        for t in ts:
            t.join()
    assert not errors, errors[:3]
    assert os.listdir(tmp_path / "free"), "replaced files were not recycled"
    for cid in ids:
        assert e.read(cid) == model.get(cid)
        if cid in model:
            path = e.chunk_path(cid)
            assert os.path.getsize(path) == 64 + len(model[cid]) + 4 * (-(-len(model[cid]) // 4096))
    e2 = ChunkEngine(str(tmp_path), "none", 1 << 40, 1 << 20)
    assert not os.listdir(tmp_path / "free")
    for cid in ids:
        assert e2.read(cid) == model.get(cid)


def test_open_span_gives_file_range_and_crcs(tmp_path):
    """Zero-copy read spans: the descriptor and offset address exactly the committed bytes, the
    CRCs are the stored ones (whole chunk or per 4 KiB block), unaligned ranges and missing
    chunks are refused, and an open span keeps its file from being recycled."""
    from threefs import _C
    e = ChunkEngine(str(tmp_path), "none", 1 << 40, 1 << 20)
    rng = random.Random()
    n = rng.randrange(3 * 4096 + 1, 300_000)
    data = rng.randbytes(n)
    cid = chunk_id(5, 0)
    e.update(cid, 1, 1, 0, data)
    assert e.open_span(cid, 0, n)[0] == 0  # only pending: nothing committed
    e.commit(cid, 1)
    st, sp = e.open_span(cid, 0, 1 << 20)
    assert st == 1 and sp.whole and sp.n == n and sp.crc == crc32c(data)
    assert os.pread(sp.fd, sp.n, sp.file_offset) == data
    sp.close()
    sp.close()  # idempotent
    end = n // 4096 * 4096
    for off, ln in ((4096, 8192), (0, 4096), (end, 1 << 20), (8192, n)):
        st, sp = e.open_span(cid, off, ln)
        want = data[off:off + ln]
        assert st == 1 and not sp.whole and sp.n == len(want)
        got = os.pread(sp.fd, sp.n, sp.file_offset)
        assert got == want and _C.verify_crc32c(got, 0, sp.block_crcs)
        bad = bytearray(got)
        bad[rng.randrange(len(bad))] ^= 1
        assert not _C.verify_crc32c(bytes(bad), 0, sp.block_crcs)
        sp.close()
    assert e.open_span(cid, 100, 4096)[0] == 2  # unaligned start
    assert e.open_span(cid, 0, 5000)[0] == 2  # unaligned end before the chunk's end
    assert e.open_span(chunk_id(6, 0), 0, 4096)[0] == 0
    with pytest.raises(ValueError):
        e.open_span(cid, -1, 10)
    # an open span holds its file: updates meanwhile go to other files, its bytes stay
    st, sp = e.open_span(cid, 0, n)
    for v in range(2, 8):
        new = rng.randbytes(n)
        e.update(cid, v, 1, 0, new)
        e.commit(cid, v)
    assert os.pread(sp.fd, sp.n, sp.file_offset) == data
    sp.close()
    assert e.read(cid) == new


def test_update_with_caller_sums(tmp_path):
    """update(sums=crc32c_sums(data)) writes the same file as update without them (the CRCs
    come from the caller's pass instead of a second one); sums are only used when data is the
    whole new content (a partial update computes its own); malformed sums raise ValueError."""
    from threefs.chunk import crc32c_sums
    rng = random.Random()
    a = ChunkEngine(str(tmp_path / "a"), "none", 1 << 40, 1 << 20)
    b = ChunkEngine(str(tmp_path / "b"), "none", 1 << 40, 1 << 20)
    cid = chunk_id(rng.randrange(1 << 40), 0)
    for ver, n in enumerate((1 << 20, 4097, rng.randrange(1, 1 << 20), 12288), start=1):
        data = rng.randbytes(n)
        sums = crc32c_sums(data)
        assert sums[0] == crc32c(data)
        assert sums[1] == b"".join(crc32c(data[i:i + 4096]).to_bytes(4, "little")
                                   for i in range(0, n, 4096))
        ma = a.update(cid, ver, 1, 0, data, n, full_replace=True, sums=sums)
        mb = b.update(cid, ver, 1, 0, data, n, full_replace=True)
        assert ma == mb and ma["pending_crc"] == crc32c(data)
        a.commit(cid, ver)
        b.commit(cid, ver)
        with open(a.chunk_path(cid), "rb") as fa, open(b.chunk_path(cid), "rb") as fb:
            assert fa.read() == fb.read()
        assert a.read(cid) == data
    # partial update: the given sums cover `piece` only, the engine computes the whole
    base = a.read(cid)
    piece = rng.randbytes(5000)
    m = a.update(cid, 5, 1, 100, piece, sums=crc32c_sums(piece))
    want = base[:100] + piece + base[5100:]
    assert m["pending_crc"] == crc32c(want)
    a.commit(cid, 5)
    assert a.read(cid) == want
    for bad in ((1, b"\0" * 3), (1,), "x"):
        with pytest.raises((ValueError, TypeError)):
            a.update(cid, 6, 1, 0, piece, full_replace=True, sums=bad)
