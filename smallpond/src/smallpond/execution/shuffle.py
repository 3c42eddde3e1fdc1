"""The shuffle task: split one input partition into N output files.

engine "native": stream record batches, group rows per output with the C++ partitioner
(``smallpond._C``), buffer and write one Parquet file per output partition.
engine "duckdb": the SQL baseline (one ``COPY ... WHERE partition = j`` per output partition).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import List

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import partition as P
from ..logical.dataset import ParquetDataSet
from .task import Task, TaskError, _copy_sql, _describe, connect, register_inputs

FLUSH_BYTES = 32 << 20        # per output partition
FLUSH_TOTAL = 512 << 20       # all buffers of a task together
READ_ROWS = 1 << 20


def _batches(task: Task, con):
    """Record batches of the single input partition, plus its schema."""
    if task.params.get("pre_query"):  # fused upstream SQL: stream its result
        names = register_inputs(con, task.inputs)
        try:
            rel = con.sql(task.params["pre_query"].format(*names))
            reader = rel.fetch_record_batch(READ_ROWS)
        except Exception as e:
            raise TaskError(f"{_describe(task)} failed: {type(e).__name__}: {e}\n  query: {task.params['pre_query']}",
                            fatal=True) from None
        return reader.schema, iter(reader)
    ds = task.inputs[0]
    if ds.empty:
        schema = ds.schema or pa.schema([])
        return schema, iter(())
    if isinstance(ds, ParquetDataSet) and ds.row_ranges is None and not ds.union_by_name:
        files = [pq.ParquetFile(p) for p in ds.paths]
        schema = files[0].schema_arrow if not ds.columns else pa.schema([files[0].schema_arrow.field(c) for c in ds.columns])

        def gen():
            for f in files:
                yield from f.iter_batches(batch_size=READ_ROWS, columns=ds.columns, use_threads=task.threads > 1)
        return schema, gen()
    register_inputs(con, task.inputs)
    reader = con.sql("select * from __input0").fetch_record_batch(READ_ROWS)
    return reader.schema, iter(reader)


def _groups(task: Task, batch: pa.RecordBatch, n: int, rng):
    p = task.params
    if p.get("data_partition_column"):
        return P.value_partition_indices(batch, p["data_partition_column"], n)
    if p.get("random_shuffle"):
        ids = rng.integers(0, n, batch.num_rows, dtype=np.int64)
        return P._C.partition_by_values((P.INT, 8, 0, None, ids, None), batch.num_rows, n)
    return P.hash_partition_indices(batch, p["hash_columns"], n)


def run_hash(task: Task, tmp: str) -> List[str]:
    if task.params.get("engine_type", "native") == "duckdb":
        return run_hash_duckdb(task, tmp)
    n = task.params["npartitions"]
    drop = task.params.get("drop_partition_column") and task.params.get("data_partition_column")
    names = [f"part-{j:05d}.parquet" for j in range(n)]
    seed = int(hashlib.sha1(task.key.encode()).hexdigest()[:8], 16)
    rng = np.random.default_rng(seed)
    writers = [None] * n
    counts = [0] * n
    buffers: List[List[pa.RecordBatch]] = [[] for _ in range(n)]
    sizes = [0] * n
    out_schema = None

    def flush(j):
        if not buffers[j]:
            return
        if writers[j] is None:
            # shuffle files are intermediates read once: plain encoding writes much faster than
            # dictionary encoding for high-cardinality keys and payloads
            writers[j] = pq.ParquetWriter(os.path.join(tmp, names[j]), out_schema, compression=task.compression,
                                          use_dictionary=False)
        writers[j].write_table(pa.Table.from_batches(buffers[j], schema=out_schema))
        buffers[j], sizes[j] = [], 0

    def _add(batch, idx, off):
        for j, part in enumerate(P.split_batch(batch, idx, off)):
            if part.num_rows:
                counts[j] += part.num_rows
                buffers[j].append(part)
                sizes[j] += part.nbytes
                if sizes[j] >= FLUSH_BYTES:
                    flush(j)
        if sum(sizes) >= FLUSH_TOTAL:
            for j in range(n):
                flush(j)

    try:
        for sub, schema, batches in _sub_inputs(task):
            if drop and drop in schema.names:
                schema = schema.remove(schema.get_field_index(drop))
            if out_schema is None or (not out_schema.names and schema.names):
                out_schema = schema
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                try:
                    idx, off = _groups(sub, batch, n, rng)
                except (ValueError, TypeError) as e:
                    raise TaskError(f"{_describe(sub)}: {e}", fatal=True) from None
                if drop:
                    batch = batch.drop_columns([drop])
                if batch.schema != out_schema:
                    batch = _conform(sub, batch, out_schema)
                _add(batch, idx, off)
        for j in range(n):
            flush(j)
    finally:
        for w in writers:
            if w is not None:
                w.close()
    out_schema = out_schema if out_schema is not None else pa.schema([])
    for j in range(n):
        if writers[j] is None:  # empty output partition: a zero-row file keeps the schema
            pq.write_table(out_schema.empty_table(), os.path.join(tmp, names[j]), compression=task.compression)
    return names, counts


def _sub_inputs(task: Task):
    """(task of one input partition, its schema, its record batches) for each input partition of
    ``task``: one, or several when small shuffle partitions were batched into one task. Each gets
    its own DuckDB connection (its own temporary views), closed once its batches are consumed."""
    parts = task.params.get("batch")
    width = task.params.get("batch_width", len(task.inputs))
    subs = [task] if not parts else [dataclasses.replace(task, partition=i, inputs=task.inputs[k * width:(k + 1) * width])
                                     for k, i in enumerate(parts)]
    for sub in subs:
        con = _LazyConnection(sub)
        try:
            schema, batches = _batches(sub, con)
            yield sub, schema, batches
        finally:
            con.close()


def _conform(task: Task, batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Cast a batch of a later input partition to the schema of the first one (same file)."""
    try:
        return pa.Table.from_batches([batch]).select(schema.names).cast(schema).combine_chunks().to_batches()[0]
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, KeyError) as e:
        raise TaskError(f"{_describe(task)}: schema {batch.schema} differs from the other partitions of this "
                        f"shuffle task ({schema}): {e}", fatal=True) from None


class _LazyConnection:
    """A DuckDB connection opened on first use (plain Parquet input never needs one)."""

    def __init__(self, task: Task) -> None:
        self.task, self.con = task, None

    def __getattr__(self, name):
        if self.con is None:
            self.con = connect(self.task)
        return getattr(self.con, name)

    def close(self) -> None:
        if self.con is not None:
            self.con.close()


def _quote(c: str) -> str:
    return '"' + c.replace('"', '""') + '"'


def run_hash_duckdb(task: Task, tmp: str) -> List[str]:
    """Baseline: compute the partition id in SQL, then one COPY per output partition."""
    p = task.params
    n = p["npartitions"]
    con = connect(task)
    try:
        names = register_inputs(con, task.inputs)
        src = f"({p['pre_query'].format(*names)})" if p.get("pre_query") else "__input0"
        if p.get("data_partition_column"):
            pid = _quote(p["data_partition_column"])
        elif p.get("random_shuffle"):
            pid = f"cast(floor(random() * {n}) as bigint)"
        else:
            pid = f"hash({', '.join(_quote(c) for c in p['hash_columns'])}) % {n}"
        con.execute(f"create temp table __parts as select *, {pid} as __pid from {src}")
        bad = con.execute(f"select __pid from __parts where __pid is null or __pid < 0 or __pid >= {n} limit 1").fetchall()
        if bad:
            raise TaskError(f"{_describe(task)}: partition id {bad[0][0]} out of range [0, {n})", fatal=True)
        excl = "__pid"
        if p.get("drop_partition_column") and p.get("data_partition_column"):
            excl += ", " + _quote(p["data_partition_column"])
        names = []
        for j in range(n):
            names.append(f"part-{j:05d}.parquet")
            con.execute(_copy_sql(f"select * exclude ({excl}) from __parts where __pid = {j}",
                                  os.path.join(tmp, names[-1]), task.compression))
        return names
    finally:
        con.close()
