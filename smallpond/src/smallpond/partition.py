"""Native hash partitioning of Arrow record batches (wraps ``smallpond._C``).

Key columns cross into C++ as raw Arrow buffers (validity bitmap, values, offsets) through the
buffer protocol; no libarrow is linked. The hash depends only on key values, so equal keys map to
the same partition on every machine (see ``ref.py`` for the plain-Python definition).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import _C

INT, UINT, FLOAT, BINARY, LARGE_BINARY, FIXED_BINARY = range(6)


def _column_tuple(arr: pa.Array, name: str) -> tuple:
    """Describe one Arrow array as (kind, width, offset, validity, data, offsets) for ``_C``."""
    t = arr.type
    if pa.types.is_dictionary(t):
        return _column_tuple(arr.dictionary_decode(), name)
    if pa.types.is_boolean(t):
        return _column_tuple(pc.cast(arr, pa.uint8()), name)
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return _column_tuple(pc.cast(arr, pa.large_binary()), name)
    if pa.types.is_float16(t):
        return _column_tuple(pc.cast(arr, pa.float32()), name)
    bufs = arr.buffers()
    validity = bufs[0] if arr.null_count else None
    if pa.types.is_signed_integer(t) or pa.types.is_temporal(t):
        return (INT, t.bit_width // 8, arr.offset, validity, bufs[1], None)
    if pa.types.is_unsigned_integer(t):
        return (UINT, t.bit_width // 8, arr.offset, validity, bufs[1], None)
    if pa.types.is_floating(t):
        return (FLOAT, t.bit_width // 8, arr.offset, validity, bufs[1], None)
    if pa.types.is_string(t) or pa.types.is_binary(t):
        data = bufs[2] if bufs[2] is not None else np.zeros(1, np.uint8)
        return (BINARY, 0, arr.offset, validity, data, bufs[1])
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        data = bufs[2] if bufs[2] is not None else np.zeros(1, np.uint8)
        return (LARGE_BINARY, 0, arr.offset, validity, data, bufs[1])
    if pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t):
        return (FIXED_BINARY, t.byte_width, arr.offset, validity, bufs[1], None)
    raise TypeError(f"hash_by: column {name!r} has type {t}, expected an integer, float, boolean, "
                    "temporal, string, binary or decimal column")


def _key_columns(batch: pa.RecordBatch, hash_columns: Sequence[str]) -> List[tuple]:
    cols = []
    for name in hash_columns:
        if name not in batch.schema.names:
            raise ValueError(f"hash_by: column {name!r} not found, available columns: {batch.schema.names}")
        arr = batch.column(name)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        cols.append(_column_tuple(arr, name))
    return cols


def hash_rows(batch: pa.RecordBatch | pa.Table, hash_columns: Sequence[str]) -> np.ndarray:
    """Stable 64-bit hash per row of ``hash_columns`` -> uint64[num_rows]."""
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else pa.RecordBatch.from_pylist([], schema=batch.schema)
    return _C.hash_columns(_key_columns(batch, hash_columns), batch.num_rows)


def hash_partition_indices(batch: pa.RecordBatch, hash_columns: Sequence[str],
                           npartitions: int) -> Tuple[np.ndarray, np.ndarray]:
    """Rows of ``batch`` grouped by hash bucket.

    Returns (indices int64[num_rows], offsets int64[npartitions + 1]): rows of partition p are
    ``indices[offsets[p]:offsets[p+1]]``, in their original order.
    """
    _check_npartitions(npartitions)
    return _C.hash_partition(_key_columns(batch, hash_columns), batch.num_rows, npartitions)


def value_partition_indices(batch: pa.RecordBatch, column: str,
                            npartitions: int) -> Tuple[np.ndarray, np.ndarray]:
    """Rows grouped by the partition id stored in integer ``column`` (must lie in [0, npartitions))."""
    _check_npartitions(npartitions)
    if column not in batch.schema.names:
        raise ValueError(f"repartition(by=...): column {column!r} not found, available columns: {batch.schema.names}")
    arr = batch.column(column)
    if not pa.types.is_integer(arr.type):
        raise TypeError(f"repartition(by=...): column {column!r} must be an integer column, got {arr.type}")
    try:
        return _C.partition_by_values(_column_tuple(arr, column), batch.num_rows, npartitions)
    except ValueError as e:
        raise ValueError(f"repartition(by={column!r}): {e}") from None


def split_batch(batch: pa.RecordBatch, indices: np.ndarray, offsets: np.ndarray) -> List[pa.RecordBatch]:
    """Cut ``batch`` into len(offsets)-1 batches following ``indices``/``offsets``."""
    grouped = batch.take(pa.array(indices)) if batch.num_rows else batch
    return [grouped.slice(offsets[p], offsets[p + 1] - offsets[p]) for p in range(len(offsets) - 1)]


def hash_partition_batch(batch: pa.RecordBatch, hash_columns: Sequence[str], npartitions: int) -> List[pa.RecordBatch]:
    """Split ``batch`` into ``npartitions`` batches by a stable hash of ``hash_columns``."""
    idx, off = hash_partition_indices(batch, hash_columns, npartitions)
    return split_batch(batch, idx, off)


def _check_npartitions(n) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"npartitions: expected an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"npartitions: expected >= 1, got {n}")
