"""Plain-Python oracle of the native partitioner (slow; used by the tests).

hash(row) = fold(combine, [value_hash(col[row]) for col in key columns], SEED), all arithmetic on
unsigned 64-bit integers; value bytes are read little-endian. partition = (hash * n) >> 64.
"""
from __future__ import annotations

import math
import struct
from typing import Any, List, Sequence

M64 = (1 << 64) - 1
SEED = 0x2545F4914F6CDD1D
NULL = 0x6E756C6C6E756C6C
GOLDEN = 0x9E3779B97F4A7C15
MUL1 = 0x87C37B91114253D5
MUL2 = 0x4CF5AD432745937F


def fmix64(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    k ^= k >> 33
    return k


def rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & M64


def hash_bytes(b: bytes) -> int:
    h = (len(b) * MUL1) & M64
    n8 = len(b) // 8 * 8
    for i in range(0, n8, 8):
        h ^= fmix64((int.from_bytes(b[i:i + 8], "little") * MUL2) & M64)
        h = (rotl(h, 27) * MUL1 + GOLDEN) & M64
    tail = len(b) - n8
    if tail:
        h ^= fmix64(((int.from_bytes(b[n8:], "little") * MUL2) & M64) ^ tail)
    return fmix64(h)


def hash_u64(x: int) -> int:
    return fmix64((x & M64) ^ GOLDEN)


def combine(h: int, v: int) -> int:
    return fmix64(h ^ ((v + GOLDEN + ((h << 6) & M64) + (h >> 2)) & M64))


def value_hash(v: Any, kind: str) -> int:
    """kind: 'int' (incl. bool/temporal as integer), 'uint', 'float', 'bytes' (str is UTF-8)."""
    if v is None:
        return NULL
    if kind == "int" or kind == "uint":
        return hash_u64(int(v))
    if kind == "float":
        d = float(v)
        if d == 0.0:
            d = 0.0
        if math.isnan(d):
            return hash_u64(0x7FF8000000000000)
        return hash_u64(struct.unpack("<Q", struct.pack("<d", d))[0])
    if kind == "bytes":
        return hash_bytes(v.encode() if isinstance(v, str) else bytes(v))
    raise ValueError(f"kind: unknown {kind!r}")


def row_hash(values: Sequence[Any], kinds: Sequence[str]) -> int:
    h = SEED
    for v, k in zip(values, kinds):
        h = combine(h, value_hash(v, k))
    return h


def bucket(h: int, n: int) -> int:
    return (h * n) >> 64


def partition_ids(columns: List[list], kinds: Sequence[str], n: int) -> List[int]:
    """columns: list of Python value lists (one per key column) -> partition id per row."""
    nrows = len(columns[0]) if columns else 0
    return [bucket(row_hash([c[r] for c in columns], kinds), n) for r in range(nrows)]
