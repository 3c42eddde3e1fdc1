"""Plain-Python oracles used by the tests: CRC32C, a chunk model and the target-state table."""
from __future__ import annotations

_POLY = 0x82F63B78
_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ (_POLY if _c & 1 else 0)
    _TABLE.append(_c)


def crc32c(data: bytes, crc: int = 0) -> int:
    """Bitwise-table CRC32C (Castagnoli) of `data`, continuing from `crc`."""
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ _TABLE[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


class ChunkModel:
    """In-memory model of one chunk: committed and pending bytes with versions."""

    def __init__(self):
        self.committed = None  # bytes or None
        self.committed_ver = 0
        self.pending = None
        self.pending_ver = 0

    def update(self, ver: int, offset: int, data: bytes, truncate_to: int = -1,
               full_replace: bool = False) -> None:
        base = b"" if full_replace else (self.pending if self.pending is not None
                                         else (self.committed or b""))
        buf = bytearray(base)
        if len(buf) < offset + len(data):
            buf.extend(b"\0" * (offset + len(data) - len(buf)))
        buf[offset:offset + len(data)] = data
        if truncate_to >= 0:
            buf = buf[:truncate_to] + b"\0" * max(0, truncate_to - len(buf))
        self.pending, self.pending_ver = bytes(buf), ver

    def commit(self, ver: int) -> None:
        assert self.pending_ver == ver
        self.committed, self.committed_ver = self.pending, ver
        self.pending, self.pending_ver = None, 0


# Target states (3FS design notes). Local: uptodate, online, offline.
# Public: serving, syncing, waiting, lastsrv, offline.
def next_public_state(local: str, current: str, pred: str | None) -> str:
    """Oracle for the state table; `pred` is the predecessor's public state (None: none)."""
    table = {
        ("uptodate", "serving"): "serving", ("uptodate", "syncing"): "serving",
        ("uptodate", "lastsrv"): "serving", ("uptodate", "waiting"): "waiting",
        ("uptodate", "offline"): "waiting",
        ("online", "serving"): "serving", ("online", "lastsrv"): "serving",
        ("online", "offline"): "waiting",
        ("offline", "syncing"): "offline", ("offline", "waiting"): "offline",
        ("offline", "offline"): "offline", ("offline", "lastsrv"): "lastsrv",
    }
    if (local, current) in table:
        return table[(local, current)]
    if local == "online" and current in ("syncing", "waiting"):
        return "syncing" if pred == "serving" else "waiting"
    if local == "offline" and current == "serving":
        return "lastsrv" if pred is None else "offline"
    raise ValueError(f"unknown state pair ({local!r}, {current!r})")
