"""Session: configuration, the executor, and the entry points that create DataFrames.

Configuration precedence: explicit argument > SP_* environment variable > default.
"""
from __future__ import annotations

import os
import re
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

import pyarrow as pa

from .dataframe import DataFrame
from .execution.driver import Driver
from .execution.executor import LocalExecutor, RayExecutor
from .execution.report import write_report
from .logical.dataset import (ArrowTableDataSet, CsvDataSet, JsonDataSet, PandasDataSet, ParquetDataSet)
from .logical.node import Context, DataSourceNode, LogicalPlan, Node, SqlEngineNode
from .storage import Storage

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*$", re.I)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(value: Union[int, str], arg: str) -> int:
    """'4GB', '512MiB' or an int of bytes -> bytes."""
    if isinstance(value, bool):
        raise TypeError(f"{arg}: expected bytes as int or a size string like '4GB', got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and _SIZE.match(value):
        num, unit = _SIZE.match(value).groups()
        n = int(float(num) * _UNITS[(unit or "").upper()])
    else:
        raise ValueError(f"{arg}: expected bytes as int or a size string like '4GB', got {value!r}")
    if n < (16 << 20):
        raise ValueError(f"{arg}: expected at least 16 MiB, got {value!r}")
    return n


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


def _pick(name: str, explicit, env: str, default, conv=str):
    if explicit is not None:
        return explicit
    if env in os.environ and os.environ[env] != "":
        try:
            return conv(os.environ[env])
        except ValueError:
            raise ValueError(f"{name}: environment variable {env}={os.environ[env]!r} is not valid") from None
    return default


def _positive_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}: expected a positive int, got {v!r}")
    return v


def _bool(s: str) -> bool:
    return s.strip().lower() in ("1", "true", "yes", "on")


@dataclass
class Config:
    job_id: str
    job_time: float
    job_name: str
    data_root: str
    num_executors: int
    ray_address: Optional[str]
    threads: int
    memory_limit: int
    max_retries: int
    progress: bool
    compression: str
    report_format: str
    threefs_mount: Optional[str]
    fuse: bool = True
    shuffle_compression: str = "none"


class Session:
    """Create with ``smallpond.init(...)``. Holds the executor (local process pool, or Ray)."""

    def __init__(self, job_id: Optional[str] = None, job_time: Optional[float] = None,
                 job_name: Optional[str] = None, data_root: Optional[str] = None,
                 num_executors: Optional[int] = None, ray_address: Optional[str] = None,
                 bind_socket_port: Optional[int] = None, enable_profiling: bool = False,
                 platform: Optional[str] = None, *, memory_limit: Union[int, str, None] = None,
                 cpu_limit: Optional[int] = None, max_retries: Optional[int] = None,
                 progress: Optional[bool] = None, compression: Optional[str] = None,
                 report_format: Optional[str] = None, threefs_mount: Optional[str] = None,
                 threefs_client: Any = None, threefs_options: Optional[dict] = None,
                 fuse: Optional[bool] = None, shuffle_compression: Optional[str] = None) -> None:
        ncpu = os.cpu_count() or 1
        job_id = _pick("job_id", job_id, "SP_JOBID", None) or uuid.uuid4().hex[:16]
        if not isinstance(job_id, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", job_id):
            raise ValueError(f"job_id: expected letters, digits, '.', '_' or '-', got {job_id!r}")
        num_executors = _positive_int("num_executors", _pick("num_executors", num_executors, "SP_NUM_EXECUTORS", ncpu, int))
        threads = _positive_int("cpu_limit", _pick("cpu_limit", cpu_limit, "SP_CPU_LIMIT", max(1, ncpu // num_executors), int))
        mem = _pick("memory_limit", memory_limit, "SP_MEMORY_LIMIT", None)
        mem = parse_size(mem, "memory_limit") if mem is not None else max(64 << 20, int(_total_memory() * 0.6) // num_executors)
        retries = _pick("max_retries", max_retries, "SP_MAX_RETRIES", 2, int)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"max_retries: expected an int >= 0, got {retries!r}")
        data_root = _pick("data_root", data_root, "SP_DATA_ROOT", os.path.join(tempfile.gettempdir(), "smallpond"))
        if not isinstance(data_root, (str, os.PathLike)):
            raise TypeError(f"data_root: expected a path string, got {type(data_root).__name__}")
        report_format = _pick("report_format", report_format, "SP_REPORT_FORMAT", "html")
        if report_format not in ("html", "png", "none"):
            raise ValueError(f"report_format: expected 'html', 'png' or 'none', got {report_format!r}")
        codecs = ("none", "snappy", "zstd", "gzip", "lz4", "brotli")
        shuffle_compression = _pick("shuffle_compression", shuffle_compression, "SP_SHUFFLE_COMPRESSION", "none")
        if shuffle_compression not in codecs:
            raise ValueError(f"shuffle_compression: expected one of {codecs}, got {shuffle_compression!r}")
        self.config = Config(
            job_id=job_id,
            job_time=_pick("job_time", job_time, "SP_JOB_TIME", time.time(), float),
            job_name=_pick("job_name", job_name, "SP_JOB_NAME", "smallpond"),
            data_root=os.path.abspath(os.fspath(data_root)),
            num_executors=num_executors,
            ray_address=_pick("ray_address", ray_address, "SP_RAY_ADDRESS", None),
            threads=threads, memory_limit=mem, max_retries=retries,
            progress=_pick("progress", progress, "SP_PROGRESS", True, _bool),
            compression=_pick("compression", compression, "SP_COMPRESSION", "snappy"),
            report_format=report_format,
            threefs_mount=_pick("threefs_mount", threefs_mount, "SP_THREEFS_MOUNT", None),
            fuse=_pick("fuse", fuse, "SP_FUSE", True, _bool),
            shuffle_compression=shuffle_compression,
        )
        self.job_dir = os.path.join(self.config.data_root, self.config.job_id)
        os.makedirs(self.job_dir, exist_ok=True)
        self.storage = Storage(os.path.join(self.job_dir, "cache"), self.config.threefs_mount, threefs_client,
                               threefs_options)
        self._ctx = Context()
        if self.config.ray_address:
            self.executor = RayExecutor(self.config.ray_address, self.config.max_retries)
        else:
            self.executor = LocalExecutor(self.config.num_executors, self.config.max_retries)
            self.executor.start()
        self._driver = Driver(self)
        self._closed = False

    # -- reading ---------------------------------------------------------------------------
    def read_parquet(self, paths: Union[str, List[str]], recursive: bool = False,
                     columns: Optional[List[str]] = None, union_by_name: bool = False) -> DataFrame:
        """Parquet files (paths, globs or folders) as a one-partition DataFrame."""
        return self._source(ParquetDataSet(paths, recursive=recursive, columns=columns, union_by_name=union_by_name))

    def read_csv(self, paths: Union[str, List[str]], schema: Dict[str, str], delim: str = ",",
                 header: bool = False) -> DataFrame:
        """CSV files; ``schema`` maps column names to DuckDB types, e.g. {"a": "BIGINT"}."""
        return self._source(CsvDataSet(paths, schema, delim, header=header))

    def read_json(self, paths: Union[str, List[str]], schema: Dict[str, str]) -> DataFrame:
        """Newline-delimited JSON files; ``schema`` maps column names to DuckDB types."""
        return self._source(JsonDataSet(paths, schema))

    def from_items(self, items: List[Any]) -> DataFrame:
        """Python objects: a list of dicts becomes columns; anything else one column ``item``."""
        if not isinstance(items, (list, tuple)):
            raise TypeError(f"items: expected a list, got {type(items).__name__}")
        if items and all(isinstance(x, dict) for x in items):
            table = pa.Table.from_pylist(list(items))
        else:
            table = pa.table({"item": list(items)})
        return self.from_arrow(table)

    def from_pandas(self, df) -> DataFrame:
        return self._source(PandasDataSet(df))

    def from_arrow(self, table: pa.Table) -> DataFrame:
        return self._source(ArrowTableDataSet(table))

    def _source(self, dataset) -> DataFrame:
        return DataFrame(self, DataSourceNode(self._ctx, dataset))

    def partial_sql(self, query: str, *inputs: DataFrame, **kwargs) -> DataFrame:
        """Run ``query`` on every partition; ``{0}``, ``{1}``, ... are partition i of ``inputs``,
        which must have the same number of partitions."""
        if not inputs:
            raise ValueError("partial_sql: at least one input DataFrame is required")
        for k, df in enumerate(inputs):
            if not isinstance(df, DataFrame):
                raise TypeError(f"partial_sql: input {k} must be a DataFrame, got {type(df).__name__}")
        plan = SqlEngineNode(self._ctx, tuple(df.plan for df in inputs), query, **kwargs)
        return DataFrame(self, plan)

    # -- execution ---------------------------------------------------------------------------
    def execute(self, plan: Union[LogicalPlan, Node]):
        """Run a logical plan (or node) built by hand; returns its output partitions (DataSets)."""
        self._check_open()
        root = plan.root_node if isinstance(plan, LogicalPlan) else plan
        if not isinstance(root, Node):
            raise TypeError(f"plan: expected a LogicalPlan or Node, got {type(plan).__name__}")
        return self._driver.execute(root)

    @property
    def stages(self):
        return self._driver.stages

    def report(self, path: Optional[str] = None) -> str:
        """Write the job report (HTML, or PNG if ``path`` ends in .png); returns its path."""
        path = path or os.path.join(self.job_dir, f"report.{self.config.report_format}")
        return write_report(path, self.config.job_id, self._driver.stages)

    def _write_report(self) -> None:
        if self.config.report_format != "none":
            self.report()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this session was shut down; create a new one with smallpond.init()")

    def shutdown(self) -> None:
        """Stop the workers (or disconnect from Ray). The report is written after every execution."""
        if self._closed:
            return
        self._closed = True
        self.executor.shutdown()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        c = self.config
        where = f"ray={c.ray_address}" if c.ray_address else f"local x{c.num_executors}"
        return f"Session(job_id={c.job_id!r}, {where}, data_root={c.data_root!r})"


def init(job_id: Optional[str] = None, job_time: Optional[float] = None, job_name: Optional[str] = None,
         data_root: Optional[str] = None, num_executors: Optional[int] = None, ray_address: Optional[str] = None,
         bind_socket_port: Optional[int] = None, enable_profiling: bool = False, platform: Optional[str] = None,
         **kwargs) -> Session:
    """Start a smallpond session.

    Each argument may also come from an environment variable (SP_JOBID, SP_JOB_TIME, SP_JOB_NAME,
    SP_DATA_ROOT, SP_NUM_EXECUTORS, SP_RAY_ADDRESS, SP_MEMORY_LIMIT, SP_CPU_LIMIT, SP_MAX_RETRIES,
    SP_PROGRESS, SP_THREEFS_MOUNT); an explicit argument always wins over the environment.
    Re-running with the same ``job_id`` and ``data_root`` resumes: finished tasks are not rerun.
    Keyword-only extras: memory_limit (per task), cpu_limit (DuckDB threads per task),
    max_retries, progress, compression, report_format ("html" | "png" | "none"),
    threefs_mount, threefs_client, threefs_options, fuse (run a SQL node inside the shuffle
    that reads it, default True), shuffle_compression (Parquet codec of shuffle files that are
    read once by the next stage, default "none"; a shuffle that feeds write_parquet directly
    uses ``compression``).
    """
    return Session(job_id, job_time, job_name, data_root, num_executors, ray_address, bind_socket_port,
                   enable_profiling, platform, **kwargs)
