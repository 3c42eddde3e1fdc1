"""Chunk engine (C++) front-end: argument checks and chunk-id helpers.

A chunk id is 12 bytes: inode id (u64, big endian) + chunk index (u32, big endian), so that all
chunks of one file are adjacent in the engine's ordered index (`list(prefix=inode_prefix(i))`).
"""
from __future__ import annotations

import os
import struct

from . import _C

ChecksumError = _C.ChecksumError
VersionError = _C.VersionError
FSYNC_POLICIES = ("none", "data", "full")
crc32c = _C.crc32c
crc32c_sums = _C.crc32c_sums


def chunk_id(inode: int, index: int) -> bytes:
    return struct.pack(">QI", inode, index)


def inode_prefix(inode: int) -> bytes:
    return struct.pack(">Q", inode)


def split_chunk_id(cid: bytes) -> tuple[int, int]:
    return struct.unpack(">QI", cid)


def _check_id(chunk_id) -> bytes:
    if not isinstance(chunk_id, (bytes, bytearray)) or not 0 < len(chunk_id) <= 64:
        raise TypeError(f"chunk_id must be 1..64 bytes, got {type(chunk_id).__name__} "
                        f"{chunk_id!r:.40}")
    return bytes(chunk_id)


class ChunkEngine:
    """Chunks of one storage target on a local directory.

    root: directory; fsync_policy: 'none' (atomic across process crashes only), 'data' (fsync each
    new chunk file before its rename), 'full' (also fsync the directory after every rename);
    capacity_bytes: the target's size (writes beyond it fail with ENOSPC); max_chunk_size: bytes.
    """

    def __init__(self, root: str, fsync_policy: str = "none", capacity_bytes: int = 1 << 40,
                 max_chunk_size: int = 1 << 20):
        if fsync_policy not in FSYNC_POLICIES:
            raise ValueError(f"fsync_policy must be one of {FSYNC_POLICIES}, got {fsync_policy!r}")
        if not isinstance(max_chunk_size, int) or not 0 < max_chunk_size <= (1 << 30):
            raise ValueError(f"max_chunk_size must be an int in (0, 2**30], got {max_chunk_size!r}")
        if not isinstance(capacity_bytes, int) or capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be a positive int, got {capacity_bytes!r}")
        self.max_chunk_size = max_chunk_size
        os.makedirs(root, exist_ok=True)
        self._e = _C.ChunkEngine(str(root), fsync_policy, capacity_bytes, max_chunk_size)

    def update(self, chunk_id: bytes, ver: int, chain_ver: int, offset: int, data,
               truncate_to: int = -1, full_replace: bool = False, sums=None) -> dict:
        """Create pending version `ver` with `data` (bytes-like, uint8) at `offset`.
        sums: crc32c_sums(data), computed by the caller over these bytes (e.g. while checking
        them), used instead of a second CRC pass when data is the chunk's whole new content."""
        cid = _check_id(chunk_id)
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        n = memoryview(data).nbytes
        if offset + n > self.max_chunk_size:
            raise ValueError(f"offset + len(data) must be <= max_chunk_size {self.max_chunk_size},"
                             f" got {offset} + {n}")
        if truncate_to > self.max_chunk_size:
            raise ValueError(f"truncate_to must be <= {self.max_chunk_size}, got {truncate_to}")
        return self._e.update(cid, ver, chain_ver, offset, data, truncate_to, full_replace, sums)

    def commit(self, chunk_id: bytes, ver: int) -> bool:
        return self._e.commit(_check_id(chunk_id), ver)

    def replace_committed(self, chunk_id: bytes, ver: int, chain_ver: int, data) -> dict:
        return self._e.replace_committed(_check_id(chunk_id), ver, chain_ver, data)

    def read(self, chunk_id: bytes, offset: int = 0, length: int = 1 << 62,
             verify: bool = True, pending: bool = False):
        """Committed (or pending) bytes [offset, offset+length), or None when there are none."""
        if offset < 0 or length < 0:
            raise ValueError(f"offset and length must be >= 0, got {offset}, {length}")
        return self._e.read(_check_id(chunk_id), offset, length, verify, pending)

    def open_span(self, chunk_id: bytes, offset: int, length: int):
        """(status, Span|None) for a zero-copy read of committed bytes [offset, offset+length):
        status 0 = nothing committed, 2 = range not 4 KiB-aligned (use read), 1 = a Span with
        fd, file_offset, n, whole, crc (of the whole chunk), block_crcs (LE u32 per 4 KiB block
        of the range, when not whole) and close(); the file is kept from reuse until close().
        The bytes are not verified here: the receiver checks them against the CRCs."""
        if offset < 0 or length < 0:
            raise ValueError(f"offset and length must be >= 0, got {offset}, {length}")
        return self._e.open_span(_check_id(chunk_id), offset, length)

    def abort(self, chunk_id: bytes, ver: int) -> bool:
        """Drop pending version `ver`."""
        return self._e.abort(_check_id(chunk_id), ver)

    def reserve(self, chunk_id: bytes, new_size: int) -> None:
        """Take the space of a new pending version of new_size bytes now (OSError ENOSPC if it does not fit), before
        the write goes on down the chain; the chunk's next update uses it, unreserve gives back what none used."""
        self._e.reserve(_check_id(chunk_id), new_size)

    def unreserve(self, chunk_id: bytes) -> None:
        self._e.unreserve(_check_id(chunk_id))

    def meta(self, chunk_id: bytes):
        return self._e.meta(_check_id(chunk_id))

    def list(self, prefix: bytes = b"", limit: int = 1 << 62) -> list:
        return self._e.list(bytes(prefix), limit)

    def remove(self, chunk_id: bytes) -> bool:
        return self._e.remove(_check_id(chunk_id))

    def chunk_path(self, chunk_id: bytes, pending: bool = False) -> str:
        return self._e.chunk_path(_check_id(chunk_id), pending)

    def used_bytes(self) -> int:
        return self._e.used_bytes()

    def capacity_bytes(self) -> int:
        return self._e.capacity_bytes()

    def chunk_count(self) -> int:
        return self._e.chunk_count()

    def set_crash_point(self, point: str) -> None:
        """Test hook: _exit(86) at 'after_data_write', 'after_pending_rename',
        'before_commit_rename' or 'after_commit_rename'."""
        self._e.set_crash_point(point)
