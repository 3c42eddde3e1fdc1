"""Native hash partitioner vs the plain-Python oracle (smallpond.ref)."""
import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from smallpond import partition as P
from smallpond import ref as R


def _kind(t: pa.DataType) -> str:
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytes"
    return "int"


def _pyvals(arr: pa.Array):
    t = arr.type
    if pa.types.is_temporal(t):
        return arr.cast(pa.int64() if t.bit_width == 64 else pa.int32()).to_pylist()
    if pa.types.is_boolean(t):
        return [None if v is None else int(v) for v in arr.to_pylist()]
    return arr.to_pylist()


def _oracle(batch: pa.RecordBatch, cols, n):
    vals = [_pyvals(batch.column(c)) for c in cols]
    kinds = [_kind(batch.column(c).type) for c in cols]
    return R.partition_ids(vals, kinds, n)


def _random_column(rng, t: pa.DataType, n: int) -> pa.Array:
    mask = rng.random(n) < 0.1
    if pa.types.is_integer(t):
        info = np.iinfo(t.to_pandas_dtype())
        v = rng.integers(info.min, info.max, n, dtype=t.to_pandas_dtype(), endpoint=True)
        return pa.array(v, t, mask=mask)
    if pa.types.is_floating(t):
        v = rng.standard_normal(n).astype(t.to_pandas_dtype())
        v[:3] = [0.0, -0.0, np.nan]
        return pa.array(v, t, mask=mask)
    if pa.types.is_boolean(t):
        return pa.array(rng.random(n) < 0.5, t, mask=mask)
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        v = rng.integers(0, 2**31, n)
        return pa.array(v, pa.int64() if t.bit_width == 64 else pa.int32(), mask=mask).cast(t)
    if pa.types.is_fixed_size_binary(t):
        return pa.array([None if m else rng.bytes(t.byte_width) for m in mask], t)
    words = ["", "a", "ab", "hello", "exactly8", "more than eight bytes", "ünïcødé"]
    vals = [None if m else words[rng.integers(len(words))] + str(rng.integers(1000)) for m in mask]
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        vals = [None if v is None else v.encode() for v in vals]
    return pa.array(vals, t)


TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.uint64(), pa.float32(),
         pa.float64(), pa.bool_(), pa.string(), pa.large_string(), pa.binary(), pa.large_binary(),
         pa.binary(10), pa.timestamp("us"), pa.date32()]


@pytest.mark.parametrize("t", TYPES, ids=str)
@pytest.mark.parametrize("n", [1, 7, 64])
def test_matches_oracle_per_type(t, n):
    rng = np.random.default_rng(hash((str(t), n)) % 2**32)
    batch = pa.record_batch({"k": _random_column(rng, t, 300)})
    idx, off = P.hash_partition_indices(batch, ["k"], n)
    got = np.empty(batch.num_rows, np.int64)
    got[:] = -1  # poison
    for p in range(n):
        got[idx[off[p]:off[p + 1]]] = p
    assert got.tolist() == _oracle(batch, ["k"], n)


def test_multi_column_sliced_and_nulls():
    rng = np.random.default_rng(1)
    batch = pa.record_batch({"a": _random_column(rng, pa.int32(), 500), "s": _random_column(rng, pa.string(), 500),
                             "f": _random_column(rng, pa.float64(), 500)})
    sliced = batch.slice(37, 300)  # non-zero Arrow offsets
    h = P.hash_rows(sliced, ["a", "s", "f"])
    vals = [_pyvals(sliced.column(c)) for c in "asf"]
    expect = [R.row_hash([v[r] for v in vals], ["int", "bytes", "float"]) for r in range(sliced.num_rows)]
    assert [int(x) for x in h] == expect


def test_partition_invariants_and_stability():
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 50, 20000)
    batch = pa.record_batch({"k": keys, "row": np.arange(20000)})
    parts = P.hash_partition_batch(batch, ["k"], 13)
    rows = np.concatenate([p.column("row").to_numpy() for p in parts])
    assert sorted(rows.tolist()) == list(range(20000))  # every row exactly once
    owner = {}
    for j, p in enumerate(parts):
        for k in set(p.column("k").to_pylist()):
            assert owner.setdefault(k, j) == j  # equal keys together
        assert np.all(np.diff(p.column("row").to_numpy()) > 0)  # original order kept
    # the partition of a key does not depend on the batch it arrives in, nor on the integer width
    small = pa.record_batch({"k": pa.array(keys[:100], pa.int32())})
    idx, off = P.hash_partition_indices(small, ["k"], 13)
    for j in range(13):
        for r in idx[off[j]:off[j + 1]]:
            assert owner[int(keys[r])] == j


def test_known_values_are_fixed():
    # Pinned values: a change here breaks the "same partition on every machine and version" promise.
    b = pa.record_batch({"k": pa.array([0, 1, 42], pa.int64()), "s": ["", "a", "smallpond"]})
    assert [int(x) for x in P.hash_rows(b, ["k"])] == [R.row_hash([v], ["int"]) for v in (0, 1, 42)]
    assert R.row_hash([42], ["int"]) == R.combine(R.SEED, R.fmix64(42 ^ R.GOLDEN))
    assert [int(x) for x in P.hash_rows(b, ["s"])] == [R.row_hash([v], ["bytes"]) for v in ("", "a", "smallpond")]


def test_skewed_and_empty_batches():
    batch = pa.record_batch({"k": np.zeros(1000, np.int64)})
    parts = P.hash_partition_batch(batch, ["k"], 8)
    assert sorted(p.num_rows for p in parts) == [0] * 7 + [1000]
    empty = pa.record_batch({"k": pa.array([], pa.int64())})
    parts = P.hash_partition_batch(empty, ["k"], 4)
    assert [p.num_rows for p in parts] == [0, 0, 0, 0]


def test_value_partition():
    batch = pa.record_batch({"p": pa.array([2, 0, 1, 2], pa.int16()), "x": [1, 2, 3, 4]})
    idx, off = P.value_partition_indices(batch, "p", 3)
    assert idx.tolist() == [1, 2, 0, 3] and off.tolist() == [0, 1, 2, 4]
    with pytest.raises(ValueError, match=r"row 2 has value 5, expected an id in \[0, 3\)"):
        P.value_partition_indices(pa.record_batch({"p": [0, 1, 5]}), "p", 3)
    with pytest.raises(ValueError, match="value -1"):
        P.value_partition_indices(pa.record_batch({"p": [-1]}), "p", 3)
    with pytest.raises(ValueError, match="is null"):
        P.value_partition_indices(pa.record_batch({"p": pa.array([None], pa.int64())}), "p", 3)
    with pytest.raises(TypeError, match="must be an integer column"):
        P.value_partition_indices(pa.record_batch({"p": ["a"]}), "p", 3)


def test_bad_input():
    batch = pa.record_batch({"k": [1, 2], "l": pa.array([[1], [2]])})
    with pytest.raises(ValueError, match="npartitions"):
        P.hash_partition_indices(batch, ["k"], 0)
    with pytest.raises(TypeError, match="npartitions"):
        P.hash_partition_indices(batch, ["k"], 2.0)
    with pytest.raises(ValueError, match="column 'nope' not found"):
        P.hash_partition_indices(batch, ["nope"], 2)
    with pytest.raises(TypeError, match="column 'l' has type list"):
        P.hash_partition_indices(batch, ["l"], 2)
