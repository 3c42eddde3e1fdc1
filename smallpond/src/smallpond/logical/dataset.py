"""Datasets: descriptions of data that a task reads (files on disk, or an in-memory table).

A partition of a DataFrame at run time is one DataSet. Datasets are small, picklable values;
they never hold open handles. Paths are resolved (globs expanded) by ``resolve()``.
"""
from __future__ import annotations

import glob as _glob
import hashlib
import io
import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

import pyarrow as pa
import pyarrow.parquet as pq

PathsArg = Union[str, Sequence[str]]


def _as_list(paths: PathsArg, arg: str = "paths") -> List[str]:
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    if isinstance(paths, (list, tuple)) and all(isinstance(p, (str, os.PathLike)) for p in paths):
        return [os.fspath(p) for p in paths]
    raise TypeError(f"{arg}: expected a path string or a list of path strings, got {type(paths).__name__}")


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _sql_list(paths: Sequence[str]) -> str:
    return "[" + ", ".join(_sql_str(p) for p in paths) + "]"


class DataSet:
    """Base class. ``paths`` are files (or globs before ``resolve()``)."""

    fmt = "abstract"

    def __init__(self, paths: PathsArg, root_dir: Optional[str] = None, recursive: bool = False,
                 columns: Optional[List[str]] = None, union_by_name: bool = False) -> None:
        self.paths = _as_list(paths)
        self.root_dir = root_dir
        self.recursive = bool(recursive)
        if columns is not None and (not isinstance(columns, (list, tuple)) or not all(isinstance(c, str) for c in columns)):
            raise TypeError(f"columns: expected a list of column names, got {columns!r}")
        self.columns = list(columns) if columns is not None else None
        self.union_by_name = bool(union_by_name)
        self.schema: Optional[pa.Schema] = None  # set when known (needed for empty partitions)
        self._resolved = False

    # -- paths -------------------------------------------------------------------------------
    def resolve(self) -> "DataSet":
        """Expand globs and directories; raise FileNotFoundError naming a missing path."""
        if self._resolved:
            return self
        out: List[str] = []
        for p in self.paths:
            full = os.path.join(self.root_dir, p) if self.root_dir and not os.path.isabs(p) else p
            if os.path.isdir(full):
                pattern = os.path.join(full, "**", f"*.{self.fmt}") if self.recursive else os.path.join(full, f"*.{self.fmt}")
                hits = sorted(_glob.glob(pattern, recursive=self.recursive))
            elif any(ch in full for ch in "*?["):
                hits = sorted(_glob.glob(full, recursive=self.recursive))
            else:
                hits = [full] if os.path.isfile(full) else []
            if not hits:
                raise FileNotFoundError(f"{type(self).__name__}: no file found at {full!r}")
            out.extend(os.path.abspath(h) for h in hits)
        self.paths = out
        self._resolved = True
        return self

    def signature(self) -> str:
        """Content key: paths, sizes and mtimes (changes when the data changes)."""
        h = hashlib.sha1(type(self).__name__.encode())
        for p in self.paths:
            try:
                st = os.stat(p)
                h.update(f"{p}:{st.st_size}:{st.st_mtime_ns};".encode())
            except OSError:
                h.update(f"{p};".encode())
        h.update(repr(self._options()).encode())
        return h.hexdigest()

    def _options(self) -> tuple:
        return (self.columns, self.union_by_name)

    def with_paths(self, paths: List[str]) -> "DataSet":
        ds = object.__new__(type(self))
        ds.__dict__.update(self.__dict__)
        ds.paths = list(paths)
        ds._resolved = True
        return ds

    @property
    def empty(self) -> bool:
        return len(self.paths) == 0

    # -- reading -----------------------------------------------------------------------------
    def sql_source(self) -> str:
        """A DuckDB table expression reading this dataset (for a FROM clause)."""
        raise NotImplementedError

    def projection(self) -> str:
        return ", ".join('"' + c.replace('"', '""') + '"' for c in self.columns) if self.columns else "*"

    def to_arrow_table(self, conn=None) -> pa.Table:
        import duckdb
        if self.empty:
            return (self.schema or pa.schema([])).empty_table()
        con = conn or duckdb.connect()
        try:
            return _fetch_arrow(con.sql(f"select * from {self.sql_source()}"))
        finally:
            if conn is None:
                con.close()

    def __repr__(self) -> str:
        shown = self.paths[:3] + (["..."] if len(self.paths) > 3 else [])
        return f"{type(self).__name__}({shown})"


def _fetch_arrow(rel) -> pa.Table:
    """Relation -> pyarrow.Table across DuckDB versions."""
    for name in ("to_arrow_table", "fetch_arrow_table", "arrow"):
        fn = getattr(rel, name, None)
        if fn is not None:
            out = fn()
            return out.read_all() if isinstance(out, pa.RecordBatchReader) else out
    raise RuntimeError("duckdb relation cannot produce Arrow tables")


class ParquetDataSet(DataSet):
    """Parquet files. ``row_ranges`` (one (start, end) per path) selects rows of each file."""

    fmt = "parquet"

    def __init__(self, paths: PathsArg, root_dir: Optional[str] = None, recursive: bool = False,
                 columns: Optional[List[str]] = None, union_by_name: bool = False,
                 row_ranges: Optional[List[Tuple[int, int]]] = None) -> None:
        super().__init__(paths, root_dir, recursive, columns, union_by_name)
        self.row_ranges = row_ranges

    def _options(self) -> tuple:
        return (self.columns, self.union_by_name, self.row_ranges)

    def check_schemas(self) -> pa.Schema:
        """Read every file's schema; raise ValueError on a mismatch (unless union_by_name)."""
        first = None
        for p in self.paths:
            try:
                s = pq.read_schema(p)
            except Exception as e:  # not a parquet file, truncated, ...
                raise ValueError(f"read_parquet: cannot read parquet file {p!r}: {e}") from None
            s = pa.schema([f.remove_metadata() if hasattr(f, "remove_metadata") else f for f in s]).remove_metadata()
            if first is None:
                first, first_path = s, p
            elif not self.union_by_name and not s.equals(first):
                raise ValueError(f"read_parquet: schema mismatch between {first_path!r} ({_fmt_schema(first)}) "
                                 f"and {p!r} ({_fmt_schema(s)}); pass union_by_name=True to union columns by name")
        if first is not None and self.columns:
            missing = [c for c in self.columns if c not in first.names]
            if missing and not self.union_by_name:
                raise ValueError(f"read_parquet: columns {missing} not found in {first_path!r}, which has {first.names}")
            first = pa.schema([first.field(c) for c in self.columns if c in first.names])
        self.schema = first
        return first

    def num_rows_per_file(self) -> List[int]:
        if self.row_ranges is not None:
            return [e - s for s, e in self.row_ranges]
        return [pq.read_metadata(p).num_rows for p in self.paths]

    def sql_source(self) -> str:
        opts = ", union_by_name=true" if self.union_by_name else ""
        if self.row_ranges is None:
            if self.columns:
                return f"(select {self.projection()} from read_parquet({_sql_list(self.paths)}{opts}))"
            return f"read_parquet({_sql_list(self.paths)}{opts})"
        parts = []
        proj = self.projection() if self.columns else "* exclude (file_row_number)"
        for p, (s, e) in zip(self.paths, self.row_ranges):
            parts.append(f"select {proj} from read_parquet({_sql_str(p)}, file_row_number=true) "
                         f"where file_row_number >= {int(s)} and file_row_number < {int(e)}")
        return "(" + " union all ".join(parts) + ")"

    def to_arrow_table(self, conn=None) -> pa.Table:
        if self.empty:
            return (self.schema or pa.schema([])).empty_table()
        tables = []
        for i, p in enumerate(self.paths):
            t = pq.read_table(p, columns=self.columns)
            if self.row_ranges is not None:
                s, e = self.row_ranges[i]
                t = t.slice(s, e - s)
            tables.append(t)
        try:
            return pa.concat_tables(tables, promote_options="default" if self.union_by_name else "none")
        except pa.ArrowInvalid:  # e.g. nullability differs between writers
            return pa.concat_tables(tables, promote_options="permissive")


class CsvDataSet(DataSet):
    """CSV files with an explicit ``schema`` {column: DuckDB type}."""

    fmt = "csv"

    def __init__(self, paths: PathsArg, schema: Dict[str, str], delim: str = ",", header: bool = False,
                 root_dir: Optional[str] = None, recursive: bool = False) -> None:
        super().__init__(paths, root_dir, recursive)
        _check_schema_arg(schema, "read_csv")
        if not isinstance(delim, str) or len(delim) != 1:
            raise ValueError(f"read_csv: delim must be a single character, got {delim!r}")
        self.csv_schema = dict(schema)
        self.delim = delim
        self.header = bool(header)

    def _options(self) -> tuple:
        return (self.csv_schema, self.delim, self.header)

    def sql_source(self) -> str:
        cols = "{" + ", ".join(f"{_sql_str(k)}: {_sql_str(v)}" for k, v in self.csv_schema.items()) + "}"
        return (f"read_csv({_sql_list(self.paths)}, columns={cols}, delim={_sql_str(self.delim)}, "
                f"header={'true' if self.header else 'false'}, auto_detect=false)")


class JsonDataSet(DataSet):
    """Newline-delimited JSON files with an explicit ``schema`` {column: DuckDB type}."""

    fmt = "json"

    def __init__(self, paths: PathsArg, schema: Dict[str, str], root_dir: Optional[str] = None,
                 recursive: bool = False) -> None:
        super().__init__(paths, root_dir, recursive)
        _check_schema_arg(schema, "read_json")
        self.json_schema = dict(schema)

    def _options(self) -> tuple:
        return (self.json_schema,)

    def sql_source(self) -> str:
        cols = "{" + ", ".join(f"{_sql_str(k)}: {_sql_str(v)}" for k, v in self.json_schema.items()) + "}"
        return f"read_json({_sql_list(self.paths)}, columns={cols}, format='newline_delimited')"


class ArrowTableDataSet(DataSet):
    """An in-memory Arrow table; written to Parquet under the job's data root before tasks run."""

    fmt = "arrow"

    def __init__(self, table: pa.Table) -> None:
        if not isinstance(table, pa.Table):
            raise TypeError(f"table: expected a pyarrow.Table, got {type(table).__name__}")
        super().__init__([])
        self.table = table
        self.schema = table.schema
        self._resolved = True

    def signature(self) -> str:
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, self.table.schema) as w:
            w.write_table(self.table)
        return hashlib.sha1(sink.getvalue()).hexdigest()

    def to_arrow_table(self, conn=None) -> pa.Table:
        return self.table


class PandasDataSet(ArrowTableDataSet):
    """An in-memory pandas DataFrame (converted to Arrow without its index)."""

    def __init__(self, df) -> None:
        import pandas as pd
        if not isinstance(df, pd.DataFrame):
            raise TypeError(f"df: expected a pandas.DataFrame, got {type(df).__name__}")
        super().__init__(pa.Table.from_pandas(df, preserve_index=False))


def _check_schema_arg(schema, fn: str) -> None:
    if not isinstance(schema, dict) or not schema or not all(isinstance(k, str) and isinstance(v, str) for k, v in schema.items()):
        raise TypeError(f"{fn}: schema must be a non-empty dict {{column name: DuckDB type string}}, got {schema!r}")


def _fmt_schema(s: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in s)
