"""DataFrame: a lazy, partitioned table. Transformations add logical-plan nodes; actions
(count, take, to_arrow, write_parquet, ...) execute the plan through the session's driver."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Union

import pyarrow as pa

from .logical.dataset import DataSet, ParquetDataSet
from .logical.node import (ArrowBatchNode, DataSinkNode, DataSourceNode, EvenlyDistributedPartitionNode,
                           HashPartitionNode, LimitNode, Node, SqlEngineNode)

SqlOrFunc = Union[str, Callable]


def _quote(c: str) -> str:
    return '"' + c.replace('"', '""') + '"'


class DataFrame:
    """Created by ``Session.read_*`` / ``from_*`` / ``partial_sql``; never directly."""

    def __init__(self, session, plan: Node) -> None:
        self.session = session
        self.plan = plan

    def __repr__(self) -> str:
        return f"DataFrame({self.plan!r})"

    @property
    def num_partitions(self) -> int:
        return self.plan.num_partitions

    def _new(self, node: Node) -> "DataFrame":
        return DataFrame(self.session, node)

    @property
    def _ctx(self):
        return self.session._ctx

    # -- partitioning ------------------------------------------------------------------------
    def repartition(self, npartitions: int, hash_by: Union[str, List[str], None] = None,
                    by: Optional[str] = None, by_rows: bool = False, **kwargs) -> "DataFrame":
        """Repartition into ``npartitions``.

        hash_by: column(s) whose stable hash picks the partition (native partitioner; equal keys
        together). by: an integer column holding the partition id in [0, npartitions).
        Neither: split evenly by files, or by rows when ``by_rows``.
        """
        if hash_by is not None and by is not None:
            raise ValueError("repartition: give hash_by or by, not both")
        if by is not None:
            return self._new(HashPartitionNode(self._ctx, (self.plan,), npartitions, data_partition_column=by, **kwargs))
        if hash_by is not None:
            cols = [hash_by] if isinstance(hash_by, str) else hash_by
            if not isinstance(cols, (list, tuple)) or not cols or not all(isinstance(c, str) for c in cols):
                raise TypeError(f"hash_by: expected a column name or a list of column names, got {hash_by!r}")
            return self._new(HashPartitionNode(self._ctx, (self.plan,), npartitions, hash_columns=list(cols), **kwargs))
        plan = self.plan
        if by_rows and isinstance(plan, DataSourceNode) and not isinstance(plan.dataset, ParquetDataSet) \
                and plan.dataset.fmt in ("csv", "json"):
            plan = SqlEngineNode(self._ctx, (plan,), "select * from {0}")  # rows are split on Parquet
        return self._new(EvenlyDistributedPartitionNode(self._ctx, (plan,), npartitions, partition_by_rows=by_rows, **kwargs))

    def random_shuffle(self, **kwargs) -> "DataFrame":
        """Shuffle rows randomly within each partition."""
        return self._new(SqlEngineNode(self._ctx, (self.plan,), "select * from {0} order by random()", **kwargs))

    def partial_sort(self, by: Union[str, List[str]], **kwargs) -> "DataFrame":
        """Sort each partition by ``by`` (column name(s), or SQL ORDER BY items like 'a desc')."""
        items = [by] if isinstance(by, str) else by
        if not isinstance(items, (list, tuple)) or not items or not all(isinstance(c, str) for c in items):
            raise TypeError(f"by: expected a column name or a list of column names, got {by!r}")
        keys = ", ".join(_quote(c) if c.isidentifier() else c for c in items)
        return self._new(SqlEngineNode(self._ctx, (self.plan,), f"select * from {{0}} order by {keys}", **kwargs))

    # -- row-wise ----------------------------------------------------------------------------
    def filter(self, sql_or_func: SqlOrFunc, **kwargs) -> "DataFrame":
        """Keep rows where the SQL predicate is true, or where ``func(row: dict) -> bool``."""
        if isinstance(sql_or_func, str):
            return self._new(SqlEngineNode(self._ctx, (self.plan,), f"select * from {{0}} where {sql_or_func}", **kwargs))
        fn = _callable(sql_or_func, "filter")

        def apply(t: pa.Table) -> pa.Table:
            return t.filter(pa.array([bool(fn(r)) for r in t.to_pylist()], pa.bool_()))
        return self._new(ArrowBatchNode(self._ctx, (self.plan,), process_func=apply, **kwargs))

    def map(self, sql_or_func: SqlOrFunc, *, schema: Optional[pa.Schema] = None, **kwargs) -> "DataFrame":
        """SQL select list (``"a + 1 as b, c"``), or ``func(row: dict) -> dict`` (``schema`` fixes
        the output schema; otherwise it is inferred)."""
        if isinstance(sql_or_func, str):
            return self._new(SqlEngineNode(self._ctx, (self.plan,), f"select {sql_or_func} from {{0}}", **kwargs))
        fn = _callable(sql_or_func, "map")

        def apply(t: pa.Table) -> pa.Table:
            return pa.Table.from_pylist([fn(r) for r in t.to_pylist()], schema=schema)
        return self._new(ArrowBatchNode(self._ctx, (self.plan,), process_func=apply, schema=schema, **kwargs))

    def flat_map(self, sql_or_func: SqlOrFunc, *, schema: Optional[pa.Schema] = None, **kwargs) -> "DataFrame":
        """SQL select list that may unnest (``"unnest(xs) as x"``), or ``func(row) -> list[dict]``."""
        if isinstance(sql_or_func, str):
            return self._new(SqlEngineNode(self._ctx, (self.plan,), f"select {sql_or_func} from {{0}}", **kwargs))
        fn = _callable(sql_or_func, "flat_map")

        def apply(t: pa.Table) -> pa.Table:
            return pa.Table.from_pylist([o for r in t.to_pylist() for o in fn(r)], schema=schema)
        return self._new(ArrowBatchNode(self._ctx, (self.plan,), process_func=apply, schema=schema, **kwargs))

    def map_batches(self, func: Callable[[pa.Table], pa.Table], *, batch_size: int = 122880, **kwargs) -> "DataFrame":
        """Apply ``func(pa.Table) -> pa.Table`` to batches of at most ``batch_size`` rows."""
        return self._new(ArrowBatchNode(self._ctx, (self.plan,), process_func=_callable(func, "map_batches"),
                                        batch_size=batch_size, **kwargs))

    def limit(self, limit: int) -> "DataFrame":
        """The first ``limit`` rows (in partition order), as one partition."""
        return self._new(LimitNode(self._ctx, self.plan, limit))

    def recompute(self) -> "DataFrame":
        """Recompute this DataFrame on the next action even if its output already exists."""
        self.plan.force_recompute = True
        return self

    # -- actions -----------------------------------------------------------------------------
    def _compute(self) -> List[DataSet]:
        return self.session.execute(self.plan)

    def count(self) -> int:
        """Number of rows."""
        total = 0
        for ds in self._compute():
            if ds.empty:
                continue
            if isinstance(ds, ParquetDataSet) and not ds.union_by_name:
                total += sum(ds.num_rows_per_file())
            else:
                import duckdb
                with duckdb.connect() as con:
                    total += con.execute(f"select count(*) from {ds.sql_source()}").fetchone()[0]
        return total

    def take(self, limit: int) -> List[Dict[str, Any]]:
        """The first ``limit`` rows as a list of dicts."""
        return self.limit(limit).take_all()

    def take_all(self) -> List[Dict[str, Any]]:
        return self.to_arrow().to_pylist()

    def to_arrow(self) -> pa.Table:
        """All partitions, in partition order, as one pyarrow.Table."""
        tables = [ds.to_arrow_table() for ds in self._compute()]
        non_empty = [t for t in tables if t.num_rows] or tables[:1]
        if not non_empty:
            return pa.table({})
        try:
            return pa.concat_tables(non_empty)
        except pa.ArrowInvalid:
            return pa.concat_tables(non_empty, promote_options="permissive")

    def to_pandas(self):
        return self.to_arrow().to_pandas()

    def write_parquet(self, path: str) -> None:
        """Write every partition's Parquet files into folder ``path`` (staged, then moved in)."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: expected a folder path string, got {type(path).__name__}")
        path = os.fspath(path)
        if not path.startswith("threefs://"):
            path = os.path.abspath(path)
        self.session.execute(DataSinkNode(self._ctx, (self.plan,), path))


def _callable(fn, what: str):
    """Check that ``fn`` is callable and can be shipped to worker processes."""
    from .logical.node import _pickle_func
    if not callable(fn):
        raise TypeError(f"{what}: expected a SQL string or a callable, got {type(fn).__name__}")
    _pickle_func(fn, what)
    return fn
