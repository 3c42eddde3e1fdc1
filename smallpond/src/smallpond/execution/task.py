"""Tasks: the unit of work run by an executor (one partition of one node).

A task writes its outputs into ``<out_dir>.tmp-<uuid>/`` and renames that folder to ``out_dir``
once complete, with a ``_SUCCESS.json`` manifest inside. A folder with a manifest is a finished
task: re-running a job skips it (resume), and nothing half-written is ever visible.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from ..logical.dataset import DataSet, ParquetDataSet, _fetch_arrow

MANIFEST = "_SUCCESS.json"


class TaskError(RuntimeError):
    """A task failed. ``fatal`` errors (bad SQL, bad user input) are not retried."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal

    def __reduce__(self):
        return (TaskError, (self.args[0], self.fatal))


@dataclass
class RuntimeContext:
    """Handed to user functions of ArrowComputeNode / PandasComputeNode."""
    task_key: str
    partition: int
    npartitions: int
    threads: int
    memory_limit: int
    temp_dir: str


@dataclass
class Task:
    key: str
    kind: str                 # sql | arrow | pandas | batch | hash
    node: str                 # e.g. "SqlEngineNode-3"
    partition: int
    npartitions: int
    inputs: List[DataSet]
    params: Dict[str, Any]
    out_dir: str
    threads: int = 1
    memory_limit: int = 1 << 30
    spill_dir: Optional[str] = None
    compression: str = "snappy"


@dataclass
class TaskResult:
    key: str
    node: str
    partition: int
    files: List[str]
    rows: List[int]
    bytes: int
    start: float
    end: float
    worker: str
    cached: bool = False
    attempts: int = 1
    schema: Any = None

    @property
    def num_rows(self) -> int:
        return sum(self.rows)


def load_manifest(task: Task) -> Optional[TaskResult]:
    path = os.path.join(task.out_dir, MANIFEST)
    try:
        with open(path) as f:
            m = json.load(f)
    except (OSError, ValueError):
        return None
    files = [os.path.join(task.out_dir, n) for n in m["files"]]
    return TaskResult(task.key, task.node, task.partition, files, m["rows"], m["bytes"], m["start"], m["end"],
                      m["worker"], cached=True)


def run_task(task: Task) -> TaskResult:
    """Run one task (in a worker process); returns its result or raises TaskError."""
    done = load_manifest(task)
    if done is not None:
        return done
    start = time.time()
    tmp = f"{task.out_dir}.tmp-{uuid.uuid4().hex[:12]}"
    os.makedirs(tmp)
    try:
        out = RUNNERS[task.kind](task, tmp)  # file names, or (file names, row counts)
        names, rows = out if isinstance(out, tuple) else (out, None)
        if rows is None:
            rows = [pq.read_metadata(os.path.join(tmp, n)).num_rows for n in names]
        size = sum(os.path.getsize(os.path.join(tmp, n)) for n in names)
        worker = f"{socket.gethostname()}:{os.getpid()}"
        manifest = dict(files=names, rows=rows, bytes=size, start=start, end=time.time(), worker=worker)
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f)
        try:
            os.rename(tmp, task.out_dir)
        except OSError:  # a duplicate attempt finished first: keep its output
            shutil.rmtree(tmp, ignore_errors=True)
            done = load_manifest(task)
            if done is None:
                raise
            return done
    except TaskError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise TaskError(f"{task.node} partition {task.partition} of {task.npartitions} failed: "
                        f"{type(e).__name__}: {e}") from None
    files = [os.path.join(task.out_dir, n) for n in names]
    return TaskResult(task.key, task.node, task.partition, files, rows, size, start, manifest["end"], worker)


# -- helpers ---------------------------------------------------------------------------------

_DB = None  # one DuckDB database per worker process; every task gets its own connection
_DB_SETTINGS = None  # (threads, memory MiB, spill folder) last applied to _DB


def connect(task: Task):
    """A fresh DuckDB connection for ``task`` with its thread count, memory limit and spill folder.

    A worker runs one task at a time, so the process-wide settings are the task's own; opening a
    new database per task would cost ~20 ms, a new connection on a shared one costs ~0.1 ms.
    Temporary views and tables live in the connection and disappear when the task closes it.
    """
    import duckdb
    global _DB, _DB_SETTINGS
    if _DB is None:
        _DB = duckdb.connect(config={"threads": 1})
        _DB_SETTINGS = None
    con = _DB.cursor()
    spill = task.spill_dir or ""
    settings = (max(1, task.threads), max(16, task.memory_limit >> 20), spill)
    if spill:
        os.makedirs(spill, exist_ok=True)
    if settings == _DB_SETTINGS:  # the database-wide settings of the previous task still hold
        return con
    con.execute(f"set threads = {settings[0]}")
    con.execute(f"set memory_limit = '{settings[1]}MiB'")
    try:
        con.execute(f"set temp_directory = '{spill}'")
    except duckdb.Error:  # temporary files of an earlier task are still open: start a new database
        con.close()
        _DB = None
        return connect(task)
    _DB_SETTINGS = settings
    return con


def register_inputs(con, inputs: List[DataSet]) -> List[str]:
    names = []
    for k, ds in enumerate(inputs):
        name = f"__input{k}"
        if ds.empty:
            con.register(name, (ds.schema or pa.schema([])).empty_table())
        else:
            con.execute(f"create or replace temp view {name} as select * from {ds.sql_source()}")
        names.append(name)
    return names


def _copy_sql(query: str, path: str, compression: str, row_group_size: Optional[int] = None) -> str:
    rg = f", row_group_size {int(row_group_size)}" if row_group_size else ""
    compression = "uncompressed" if compression == "none" else compression  # DuckDB's name; pyarrow's is "none"
    return f"copy ({query}) to '{path}' (format parquet, compression {compression}{rg})"


def _describe(task: Task) -> str:
    return f"{task.node} partition {task.partition} of {task.npartitions}"


def run_sql(task: Task, tmp: str) -> List[str]:
    import duckdb
    con = connect(task)
    try:
        names = register_inputs(con, task.inputs)
        query = task.params["query"].format(*names)
        try:
            res = con.execute(_copy_sql(query, os.path.join(tmp, "part-00000.parquet"), task.compression,
                                        task.params.get("row_group_size"))).fetchall()
        except duckdb.Error as e:
            fatal = isinstance(e, (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException,
                                   duckdb.ConversionException, duckdb.InvalidInputException))
            raise TaskError(f"{_describe(task)} failed: {type(e).__name__}: {e}\n  query: {task.params['query']}",
                            fatal=fatal) from None
    finally:
        con.close()
    rows = [int(res[0][0])] if res and res[0] and isinstance(res[0][0], int) else None
    return ["part-00000.parquet"], rows


def _read_table(task: Task, ds: DataSet, con=None) -> pa.Table:
    if isinstance(ds, ParquetDataSet) or ds.empty:
        return ds.to_arrow_table()
    return ds.to_arrow_table(con)


def _write_table(t: pa.Table, path: str, compression: str) -> None:
    pq.write_table(t, path, compression=compression)


def _load_func(task: Task):
    import cloudpickle
    return cloudpickle.loads(task.params["func"])


def run_arrow(task: Task, tmp: str) -> List[str]:
    fn = _load_func(task)
    ctx = RuntimeContext(task.key, task.partition, task.npartitions, task.threads, task.memory_limit, tmp)
    tables = [_read_table(task, ds) for ds in task.inputs]
    if task.kind == "pandas":
        out = fn(ctx, [t.to_pandas() for t in tables])
        import pandas as pd
        if not isinstance(out, pd.DataFrame):
            raise TaskError(f"{_describe(task)}: the function returned {type(out).__name__}, expected a pandas.DataFrame", True)
        out = pa.Table.from_pandas(out, preserve_index=False)
    else:
        out = fn(ctx, tables)
        if isinstance(out, pa.RecordBatch):
            out = pa.Table.from_batches([out])
        if not isinstance(out, pa.Table):
            raise TaskError(f"{_describe(task)}: the function returned {type(out).__name__}, expected a pyarrow.Table", True)
    _write_table(out, os.path.join(tmp, "part-00000.parquet"), task.compression)
    return ["part-00000.parquet"]


def run_batches(task: Task, tmp: str) -> List[str]:
    """Apply fn(pa.Table) -> pa.Table to batches of ``batch_size`` rows of the single input."""
    fn = _load_func(task)
    batch_size = task.params["batch_size"]
    table = _read_table(task, task.inputs[0])
    schema = task.params.get("schema")
    path = os.path.join(tmp, "part-00000.parquet")
    writer = None
    try:
        for start in range(0, max(table.num_rows, 1), batch_size):
            chunk = table.slice(start, batch_size)
            if chunk.num_rows == 0 and table.num_rows:
                break
            out = fn(chunk)
            if isinstance(out, pa.RecordBatch):
                out = pa.Table.from_batches([out])
            if not isinstance(out, pa.Table):
                raise TaskError(f"{_describe(task)}: the function returned {type(out).__name__}, expected a pyarrow.Table", True)
            if schema is not None:
                out = out.cast(schema) if out.schema != schema else out
            if writer is None:
                schema = out.schema
                writer = pq.ParquetWriter(path, schema, compression=task.compression)
            elif out.schema != schema:
                out = out.cast(schema)
            writer.write_table(out)
    finally:
        if writer is not None:
            writer.close()
    return ["part-00000.parquet"]


RUNNERS = {"sql": run_sql, "arrow": run_arrow, "pandas": run_arrow, "batch": run_batches}


def _register_hash_runner() -> None:
    from .shuffle import run_hash
    RUNNERS["hash"] = run_hash


_register_hash_runner()
