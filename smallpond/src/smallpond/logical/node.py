"""Logical-plan nodes. A node describes a computation over partitions; the driver asks each node,
in topological order, to ``plan`` a Stage (tasks + how to assemble its output partitions).

Partition i of a compute node reads partition i of each input; all inputs of a compute node must
have the same number of partitions.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import string
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import pyarrow as pa

from ..execution.task import Task, TaskResult
from .dataset import ArrowTableDataSet, CsvDataSet, DataSet, JsonDataSet, ParquetDataSet


class Context:
    """Holds the id counter of the nodes of one plan (and, for API parity, registered UDFs)."""

    def __init__(self) -> None:
        self.next_id = 0
        self.udfs: Dict[str, object] = {}

    def _new_node_id(self) -> int:
        self.next_id += 1
        return self.next_id


@dataclass
class PlanEnv:
    """What nodes need from the driver while planning."""
    job_dir: str
    threads: int
    memory_limit: int
    compression: str = "snappy"
    shuffle_compression: Optional[str] = None  # codec of intermediate shuffle files (None: compression)
    workers: Optional[int] = None   # tasks that run at once (local pool); None: unknown (Ray), never batch
    materialize: Callable[[ArrowTableDataSet], ParquetDataSet] = None
    sink: Callable[..., List[DataSet]] = None
    storage: object = None


@dataclass
class Stage:
    tasks: List[Task] = field(default_factory=list)
    finalize: Callable[[List[TaskResult]], List[DataSet]] = None


def _key(*parts) -> str:
    h = hashlib.sha1()
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\x00")
    return h.hexdigest()


def _merge(datasets: Sequence[DataSet]) -> DataSet:
    """Concatenate datasets of one kind into one (used by ConsolidateNode, LimitNode, sinks)."""
    non_empty = [d for d in datasets if not d.empty]
    if not non_empty:
        return datasets[0] if datasets else ParquetDataSet([])
    first = non_empty[0]
    if len(non_empty) == 1:
        return first
    if isinstance(first, ParquetDataSet) and all(isinstance(d, ParquetDataSet) for d in non_empty):
        if any(d.row_ranges is not None for d in non_empty):
            paths, ranges = [], []
            for d in non_empty:
                rr = d.row_ranges or [(0, n) for n in d.num_rows_per_file()]
                paths += d.paths
                ranges += rr
            out = first.with_paths(paths)
            out.row_ranges = ranges
            return out
    if any(type(d) is not type(first) for d in non_empty):
        raise ValueError(f"cannot merge partitions of different kinds: {[type(d).__name__ for d in non_empty]}")
    return first.with_paths([p for d in non_empty for p in d.paths])


class Node:
    """Base of all logical nodes."""

    def __init__(self, ctx: Context, input_deps: Tuple["Node", ...] = (), output_name: Optional[str] = None,
                 output_path: Optional[str] = None, cpu_limit: Optional[int] = None,
                 memory_limit: Optional[int] = None) -> None:
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx: expected a smallpond Context, got {type(ctx).__name__}")
        if isinstance(input_deps, Node):
            input_deps = (input_deps,)
        if not isinstance(input_deps, (tuple, list)) or not all(isinstance(d, Node) for d in input_deps):
            raise TypeError(f"input_deps: expected a tuple of Nodes, got {input_deps!r}")
        if cpu_limit is not None and (not isinstance(cpu_limit, int) or cpu_limit < 1):
            raise ValueError(f"cpu_limit: expected a positive int, got {cpu_limit!r}")
        if memory_limit is not None and (not isinstance(memory_limit, int) or memory_limit < (16 << 20)):
            raise ValueError(f"memory_limit: expected an int of bytes >= 16 MiB, got {memory_limit!r}")
        self.ctx = ctx
        self.id = ctx._new_node_id()
        self.input_deps: Tuple[Node, ...] = tuple(input_deps)
        self.output_name = output_name
        self.output_path = output_path
        self.cpu_limit = cpu_limit
        self.memory_limit = memory_limit
        self.force_recompute = False

    @property
    def name(self) -> str:
        return f"{type(self).__name__}-{self.id}"

    def __repr__(self) -> str:
        return f"{self.name}(npartitions={self.num_partitions})"

    @property
    def num_partitions(self) -> int:
        return self.input_deps[0].num_partitions

    def signature(self) -> str:
        """Everything that determines this node's output given its inputs."""
        return type(self).__name__

    def plan(self, inputs: List[List[DataSet]], env: PlanEnv) -> Stage:
        raise NotImplementedError

    # helpers for compute nodes
    def _tasks(self, kind: str, inputs: List[List[DataSet]], env: PlanEnv, params: dict,
               npartitions: int, out_partitions: Optional[int] = None) -> List[Task]:
        tasks = []
        sig = self.signature()
        for i in range(npartitions):
            ins = [parts[i] for parts in inputs]
            key = _key(sig, kind, i, npartitions, [d.signature() for d in ins])
            out_dir = os.path.join(env.job_dir, "tasks", f"{type(self).__name__}", key[:24])
            tasks.append(Task(key=key, kind=kind, node=self.name, partition=i, npartitions=npartitions,
                              inputs=ins, params=params, out_dir=out_dir,
                              threads=self.cpu_limit or env.threads,
                              memory_limit=self.memory_limit or env.memory_limit,
                              spill_dir=os.path.join(env.job_dir, "spill") if params.get("spill", True) else None,
                              compression=env.compression))
        return tasks

    def _check_same_partitions(self) -> None:
        counts = [d.num_partitions for d in self.input_deps]
        if len(set(counts)) > 1:
            raise ValueError(f"{type(self).__name__}: all inputs must have the same number of partitions, "
                             f"got {counts} for {[d.name for d in self.input_deps]}")


def _one_file_outputs(results: List[TaskResult], schema_from: Optional[pa.Schema] = None) -> List[DataSet]:
    return [ParquetDataSet(r.files).with_paths(r.files) for r in results]


class DataSourceNode(Node):
    """A dataset read as one partition."""

    def __init__(self, ctx: Context, dataset: DataSet) -> None:
        super().__init__(ctx, ())
        if not isinstance(dataset, DataSet):
            raise TypeError(f"dataset: expected a smallpond DataSet, got {type(dataset).__name__}")
        self.dataset = dataset

    @property
    def num_partitions(self) -> int:
        return 1

    def plan(self, inputs, env) -> Stage:
        ds = self.dataset
        if isinstance(ds, ArrowTableDataSet):
            ds = env.materialize(ds)
        else:
            if env.storage is not None and not ds._resolved:
                ds.paths = [q for p in ds.paths for q in env.storage.local_input(p)]
            ds.resolve()
        if isinstance(ds, ParquetDataSet) and ds.schema is None:
            ds.check_schemas()
        return Stage(finalize=lambda _: [ds])


class DataSetPartitionNode(Node):
    """Split the files (or, with ``partition_by_rows``, the rows) of the input into ``npartitions``
    contiguous, even parts; no data is moved. Extra partitions are empty."""

    def __init__(self, ctx: Context, input_deps: Tuple[Node, ...], npartitions: int,
                 partition_by_rows: bool = False, **kwargs) -> None:
        super().__init__(ctx, input_deps, **_node_kwargs(kwargs))
        _check_npartitions(npartitions)
        self.npartitions = npartitions
        self.partition_by_rows = bool(partition_by_rows)

    @property
    def num_partitions(self) -> int:
        return self.npartitions

    def signature(self) -> str:
        return f"{type(self).__name__}({self.npartitions},{self.partition_by_rows})"

    def plan(self, inputs, env) -> Stage:
        parts = [d for dep in inputs for d in dep]
        merged = _merge(parts)
        schema = next((d.schema for d in parts if d.schema is not None), None)
        n = self.npartitions
        if self.partition_by_rows:
            if not isinstance(merged, ParquetDataSet):
                raise ValueError(f"{self.name}: partition_by_rows needs Parquet input, got {type(merged).__name__}; "
                                 "convert it first (e.g. SqlEngineNode 'select * from {0}')")
            out = _split_rows(merged, n)
        else:
            units = list(range(len(merged.paths)))
            out = []
            for i in range(n):
                lo, hi = len(units) * i // n, len(units) * (i + 1) // n
                ds = merged.with_paths(merged.paths[lo:hi])
                if isinstance(ds, ParquetDataSet) and merged.row_ranges is not None:
                    ds.row_ranges = merged.row_ranges[lo:hi]
                out.append(ds)
        schema = schema or _schema_of(merged)
        for ds in out:
            ds.schema = schema
        return Stage(finalize=lambda _: out)


def _schema_of(ds: DataSet) -> Optional[pa.Schema]:
    if ds.schema is None and isinstance(ds, ParquetDataSet) and ds.paths:
        import pyarrow.parquet as pq
        s = pq.read_schema(ds.paths[0]).remove_metadata()
        ds.schema = pa.schema([s.field(c) for c in ds.columns]) if ds.columns else s
    return ds.schema


def _split_rows(ds: ParquetDataSet, n: int) -> List[ParquetDataSet]:
    counts = ds.num_rows_per_file()
    base = [s for s, _ in ds.row_ranges] if ds.row_ranges is not None else [0] * len(counts)
    total = sum(counts)
    out = []
    file_start = 0
    bounds = [total * i // n for i in range(n + 1)]
    for i in range(n):
        lo, hi = bounds[i], bounds[i + 1]
        paths, ranges = [], []
        pos = 0
        for p, c, b in zip(ds.paths, counts, base):
            s, e = max(lo, pos), min(hi, pos + c)
            if s < e:
                paths.append(p)
                ranges.append((b + s - pos, b + e - pos))
            pos += c
        part = ds.with_paths(paths)
        part.row_ranges = ranges
        out.append(part)
    return out


class EvenlyDistributedPartitionNode(DataSetPartitionNode):
    """Evenly distribute the input's files (or rows) over ``npartitions`` partitions."""

    def __init__(self, ctx: Context, input_deps: Tuple[Node, ...], npartitions: int, dimension: Optional[str] = None,
                 nested: bool = False, partition_by_rows: bool = False, **kwargs) -> None:
        super().__init__(ctx, input_deps, npartitions, partition_by_rows=partition_by_rows, **kwargs)
        self.dimension = dimension
        self.nested = nested


class ConsolidateNode(Node):
    """Merge all partitions of the input into one (no data is moved)."""

    def __init__(self, ctx: Context, input_dep: Node, dimensions: Sequence[str] = ()) -> None:
        super().__init__(ctx, (input_dep,))

    @property
    def num_partitions(self) -> int:
        return 1

    def plan(self, inputs, env) -> Stage:
        parts = inputs[0]
        merged = _merge(parts)
        if merged.schema is None:
            merged.schema = next((d.schema for d in parts if d.schema is not None), None)
        return Stage(finalize=lambda _: [merged])


class HashPartitionNode(Node):
    """Shuffle: every input partition writes ``npartitions`` files; output partition j holds the
    j-th file of every input partition.

    Partition of a row: a stable hash of ``hash_columns`` (native C++ partitioner), or the integer
    in ``data_partition_column`` (must be in [0, npartitions)), or random (``random_shuffle``).
    ``engine_type="duckdb"`` uses one SQL COPY per output partition instead (the baseline).
    """

    def __init__(self, ctx: Context, input_deps: Tuple[Node, ...], npartitions: int,
                 hash_columns: Optional[List[str]] = None, data_partition_column: Optional[str] = None,
                 random_shuffle: bool = False, shuffle_only: bool = False, drop_partition_column: bool = False,
                 engine_type: str = "native", **kwargs) -> None:
        super().__init__(ctx, input_deps, **_node_kwargs(kwargs))
        _check_npartitions(npartitions)
        if len(self.input_deps) != 1:
            raise ValueError(f"HashPartitionNode: expected exactly one input, got {len(self.input_deps)}")
        if isinstance(hash_columns, str):
            hash_columns = [hash_columns]
        given = sum([bool(hash_columns), data_partition_column is not None, bool(random_shuffle)])
        if given != 1:
            raise ValueError("HashPartitionNode: give exactly one of hash_columns, data_partition_column, random_shuffle")
        if hash_columns is not None and not all(isinstance(c, str) for c in hash_columns):
            raise TypeError(f"hash_columns: expected column names, got {hash_columns!r}")
        if data_partition_column is not None and not isinstance(data_partition_column, str):
            raise TypeError(f"data_partition_column: expected a column name, got {data_partition_column!r}")
        if engine_type not in ("native", "duckdb"):
            raise ValueError(f"engine_type: expected 'native' or 'duckdb', got {engine_type!r}")
        self.npartitions = npartitions
        self.hash_columns = list(hash_columns) if hash_columns else None
        self.data_partition_column = data_partition_column
        self.random_shuffle = bool(random_shuffle)
        self.shuffle_only = shuffle_only
        self.drop_partition_column = bool(drop_partition_column)
        self.engine_type = engine_type

    @property
    def num_partitions(self) -> int:
        return self.npartitions

    def _params(self) -> dict:
        return dict(npartitions=self.npartitions, hash_columns=self.hash_columns,
                    data_partition_column=self.data_partition_column, random_shuffle=self.random_shuffle,
                    drop_partition_column=self.drop_partition_column, engine_type=self.engine_type)

    def signature(self) -> str:
        return f"{type(self).__name__}({sorted(self._params().items())})"

    def fusable_input(self) -> Optional["SqlEngineNode"]:
        dep = self.input_deps[0]
        return dep if type(dep) is SqlEngineNode else None

    def plan(self, inputs, env, pre_query: Optional[str] = None) -> Stage:
        """``pre_query``: SQL of a fused upstream SqlEngineNode, run inside each shuffle task on
        ``inputs`` (that node's inputs) and partitioned as it streams, never written to disk."""
        params = self._params()
        if pre_query is not None:
            params["pre_query"] = pre_query
        tasks = self._tasks("hash", inputs, env, params, len(inputs[0]))
        if env.shuffle_compression and env.shuffle_compression != env.compression:
            # files in another codec than a sink would publish: another task identity
            tasks = [dataclasses.replace(t, compression=env.shuffle_compression,
                                         key=_key(t.key, env.shuffle_compression),
                                         out_dir=os.path.join(os.path.dirname(t.out_dir),
                                                              _key(t.key, env.shuffle_compression)[:24]))
                     for t in tasks]
        tasks = _batch_small_shuffle(tasks, env.workers, len(inputs))
        n = self.npartitions

        def finalize(results: List[TaskResult]) -> List[DataSet]:
            out = []
            for j in range(n):
                files = [r.files[j] for r in results]
                ds = ParquetDataSet(files).with_paths(files)
                out.append(ds)
            return out
        return Stage(tasks, finalize)


ShuffleNode = HashPartitionNode

SMALL_SHUFFLE_TASK_BYTES = 128 << 20  # input bytes below which shuffle partitions share a task


def _input_bytes(ds: DataSet) -> Optional[int]:
    if not isinstance(ds, ParquetDataSet) or ds.row_ranges is not None:
        return None
    try:
        return sum(os.path.getsize(p) for p in ds.paths)
    except OSError:
        return None


def _batch_small_shuffle(tasks: List[Task], workers: Optional[int], width: int) -> List[Task]:
    """Small shuffle input: let one task split several consecutive input partitions.

    Each input partition is still processed on its own (a fused SQL query still runs once per
    partition), but rows of all of them go into the same ``npartitions`` files: fewer tasks,
    fewer and larger shuffle files, one DuckDB connection per task. The output partitions are
    the same rows in the same order. Local executor only (``workers`` known) and Parquet inputs
    only (sizes known): the task count becomes the smallest multiple of ``workers`` giving at most
    about ``SMALL_SHUFFLE_TASK_BYTES`` of input per task, and batching happens only when every task
    then gets at least two partitions.
    """
    if not workers or len(tasks) < 2 * workers or tasks[0].params.get("engine_type") == "duckdb":
        return tasks
    sizes = [_input_bytes(d) for t in tasks for d in t.inputs]
    if any(s is None for s in sizes):
        return tasks
    groups = max(1, -(-sum(sizes) // SMALL_SHUFFLE_TASK_BYTES))
    groups = -(-groups // workers) * workers
    if 2 * groups > len(tasks):
        return tasks
    out, start = [], 0
    for g in range(groups):
        k = len(tasks) // groups + (1 if g < len(tasks) % groups else 0)
        part = tasks[start:start + k]
        start += k
        first = part[0]
        key = _key(first.node.split("-")[0], "hash-batch", [t.key for t in part])
        out_dir = os.path.join(os.path.dirname(first.out_dir), "b" + key[:23])
        params = dict(first.params, batch=[t.partition for t in part], batch_width=width)
        out.append(dataclasses.replace(first, key=key, inputs=[d for t in part for d in t.inputs], params=params,
                                       out_dir=out_dir))
    return out


def _placeholders(query: str) -> List[int]:
    idx = []
    for _, fieldname, _, _ in string.Formatter().parse(query):
        if fieldname is None:
            continue
        if not fieldname.isdigit():
            raise ValueError(f"sql_query: placeholders must be {{0}}, {{1}}, ...; got {{{fieldname}}} in {query!r}")
        idx.append(int(fieldname))
    return idx


class SqlEngineNode(Node):
    """Run ``sql_query`` on each partition in its own DuckDB (threads = cpu_limit, memory_limit,
    spilling to ``<job>/spill``). ``{0}``, ``{1}``, ... name partition i of each input."""

    def __init__(self, ctx: Context, input_deps: Tuple[Node, ...], sql_query: str, *, udfs=None,
                 enable_temp_directory: bool = True, parquet_row_group_size: Optional[int] = None, **kwargs) -> None:
        super().__init__(ctx, input_deps, **_node_kwargs(kwargs))
        if not isinstance(sql_query, str) or not sql_query.strip():
            raise TypeError(f"sql_query: expected a non-empty SQL string, got {sql_query!r}")
        used = _placeholders(sql_query)
        if not self.input_deps:
            raise ValueError("SqlEngineNode: at least one input is required")
        if used and max(used) >= len(self.input_deps):
            raise ValueError(f"sql_query: uses {{{max(used)}}} but only {len(self.input_deps)} input(s) were given")
        self._check_same_partitions()
        self.sql_query = sql_query
        self.udfs = udfs
        self.enable_temp_directory = enable_temp_directory
        self.parquet_row_group_size = parquet_row_group_size

    def signature(self) -> str:
        return f"{type(self).__name__}({self.sql_query!r},{self.parquet_row_group_size})"

    def plan(self, inputs, env) -> Stage:
        params = dict(query=self.sql_query, spill=self.enable_temp_directory,
                      row_group_size=self.parquet_row_group_size)
        return Stage(self._tasks("sql", inputs, env, params, len(inputs[0])), _one_file_outputs)


class LimitNode(Node):
    """The first ``limit`` rows of the input (in partition order), as one partition."""

    def __init__(self, ctx: Context, input_dep: Node, limit: int) -> None:
        super().__init__(ctx, (input_dep,))
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit: expected an int >= 0, got {limit!r}")
        self.limit = limit

    @property
    def num_partitions(self) -> int:
        return 1

    def signature(self) -> str:
        return f"LimitNode({self.limit})"

    def plan(self, inputs, env) -> Stage:
        merged = _merge(inputs[0])
        if merged.schema is None:
            merged.schema = next((d.schema for d in inputs[0] if d.schema is not None), None)
        params = dict(query=f"select * from {{0}} limit {self.limit}")
        return Stage(self._tasks("sql", [[merged]], env, params, 1), _one_file_outputs)


def _pickle_func(fn, what: str) -> bytes:
    import cloudpickle
    if not callable(fn):
        raise TypeError(f"{what}: expected a callable, got {type(fn).__name__}")
    try:
        return cloudpickle.dumps(fn)
    except Exception as e:
        raise TypeError(f"{what}: the function cannot be serialised to send it to workers "
                        f"({type(e).__name__}: {e}); avoid capturing locks, sockets, open files or clients") from None


class ArrowComputeNode(Node):
    """Call ``process(runtime_ctx, input_tables: List[pa.Table]) -> pa.Table`` on each partition.
    Give ``process_func`` or subclass and override ``process``."""

    kind = "arrow"

    def __init__(self, ctx: Context, input_deps: Tuple[Node, ...], *, process_func: Optional[Callable] = None,
                 **kwargs) -> None:
        super().__init__(ctx, input_deps, **_node_kwargs(kwargs))
        if not self.input_deps:
            raise ValueError(f"{type(self).__name__}: at least one input is required")
        self._check_same_partitions()
        overridden = type(self).process is not ArrowComputeNode.process and type(self).process is not PandasComputeNode.process
        if process_func is None and not overridden:
            raise ValueError(f"{type(self).__name__}: give process_func or override process()")
        self.process_func = process_func
        self._func_bytes = _pickle_func(process_func if process_func is not None else self._bound_copy(),
                                        f"{type(self).__name__}.process_func")

    def _bound_copy(self):
        import copy
        clone = copy.copy(self)
        clone.input_deps, clone.ctx, clone._func_bytes = (), None, None
        return clone.process

    def process(self, runtime_ctx, input_tables):
        return self.process_func(runtime_ctx, input_tables)

    def signature(self) -> str:
        return f"{type(self).__name__}({hashlib.sha1(self._func_bytes).hexdigest()})"

    def plan(self, inputs, env) -> Stage:
        return Stage(self._tasks(self.kind, inputs, env, dict(func=self._func_bytes), len(inputs[0])),
                     _one_file_outputs)


class PandasComputeNode(ArrowComputeNode):
    """Like ArrowComputeNode with pandas DataFrames: ``process(runtime_ctx, input_dfs) -> DataFrame``."""

    kind = "pandas"


class ArrowBatchNode(Node):
    """Apply ``process_func(pa.Table) -> pa.Table`` to batches of ``batch_size`` rows of each partition."""

    def __init__(self, ctx: Context, input_deps: Tuple[Node, ...], *, process_func: Callable,
                 batch_size: int = 122880, schema: Optional[pa.Schema] = None, **kwargs) -> None:
        super().__init__(ctx, input_deps, **_node_kwargs(kwargs))
        if len(self.input_deps) != 1:
            raise ValueError(f"ArrowBatchNode: expected exactly one input, got {len(self.input_deps)}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        if schema is not None and not isinstance(schema, pa.Schema):
            raise TypeError(f"schema: expected a pyarrow.Schema, got {type(schema).__name__}")
        self._func_bytes = _pickle_func(process_func, "process_func")
        self.batch_size = batch_size
        self.schema = schema

    def signature(self) -> str:
        return f"ArrowBatchNode({hashlib.sha1(self._func_bytes).hexdigest()},{self.batch_size},{self.schema})"

    def plan(self, inputs, env) -> Stage:
        params = dict(func=self._func_bytes, batch_size=self.batch_size, schema=self.schema)
        return Stage(self._tasks("batch", inputs, env, params, len(inputs[0])), _one_file_outputs)


class DataSinkNode(Node):
    """Place the files of all input partitions under ``output_path``: staged in a temporary folder
    beside it, then moved in, so a failure never leaves half-written output there.
    type: "link_or_copy" (hard link when possible), "copy", "link", or "manifest" (write only a
    list of the files, ``_manifest.txt``)."""

    def __init__(self, ctx: Context, input_deps: Tuple[Node, ...], output_path: str, type: str = "link_or_copy",
                 manifest_only: bool = False, is_final_node: bool = False) -> None:
        super().__init__(ctx, input_deps, output_path=output_path)
        if not isinstance(output_path, str) or not output_path:
            raise TypeError(f"output_path: expected a path string, got {output_path!r}")
        if type not in ("link_or_copy", "copy", "link", "manifest"):
            raise ValueError(f"type: expected 'link_or_copy', 'copy', 'link' or 'manifest', got {type!r}")
        self.type = "manifest" if manifest_only else type
        self.is_final_node = is_final_node

    @property
    def num_partitions(self) -> int:
        return sum(d.num_partitions for d in self.input_deps)

    def plan(self, inputs, env) -> Stage:
        parts = [d for dep in inputs for d in dep]
        out = env.sink(parts, self.output_path, self.type)
        return Stage(finalize=lambda _: out)


class RootNode(Node):
    """Groups several nodes so that one plan executes them all."""

    def __init__(self, ctx: Context, input_deps: Tuple[Node, ...]) -> None:
        super().__init__(ctx, input_deps)

    @property
    def num_partitions(self) -> int:
        return sum(d.num_partitions for d in self.input_deps)

    def plan(self, inputs, env) -> Stage:
        out = [d for dep in inputs for d in dep]
        return Stage(finalize=lambda _: out)


class LogicalPlan:
    """A plan: a context and the root node whose output is wanted."""

    def __init__(self, ctx: Context, root_node: Node) -> None:
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx: expected a smallpond Context, got {type(ctx).__name__}")
        if not isinstance(root_node, Node):
            raise TypeError(f"root_node: expected a Node, got {type(root_node).__name__}")
        self.ctx = ctx
        self.root_node = root_node

    def nodes(self) -> List[Node]:
        """All nodes, inputs before the nodes that read them."""
        order, seen = [], set()

        def visit(n: Node):
            if n.id in seen:
                return
            seen.add(n.id)
            for d in n.input_deps:
                visit(d)
            order.append(n)
        visit(self.root_node)
        return order

    def __str__(self) -> str:
        lines = []

        def show(n: Node, depth: int):
            lines.append("  " * depth + repr(n))
            for d in n.input_deps:
                show(d, depth + 1)
        show(self.root_node, 0)
        return "\n".join(lines)


def _check_npartitions(n) -> None:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"npartitions: expected an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"npartitions: expected >= 1, got {n}")


def _node_kwargs(kwargs: dict) -> dict:
    allowed = {"output_name", "output_path", "cpu_limit", "memory_limit"}
    unknown = set(kwargs) - allowed
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {sorted(unknown)}; accepted: {sorted(allowed)}")
    return kwargs
