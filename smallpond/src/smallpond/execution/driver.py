"""The driver: plans each node's stage in topological order, runs the tasks that have no
finished output yet on the executor, and records per-stage statistics for the report."""
from __future__ import annotations

import glob
import os
import shutil
import time
import uuid
from typing import Dict, List

import pyarrow as pa
import pyarrow.parquet as pq

from ..logical.dataset import ArrowTableDataSet, DataSet, ParquetDataSet
from ..logical.node import DataSinkNode, LogicalPlan, Node, PlanEnv
from .progress import StageProgress
from .report import StageStats
from .task import load_manifest


class Driver:
    def __init__(self, session) -> None:
        self.session = session
        self.outputs: Dict[Node, List[DataSet]] = {}  # keyed by node identity
        self.stages: List[StageStats] = []
        self.tasks_run = 0      # tasks executed (not found finished) since the session started
        self.tasks_cached = 0

    def env(self) -> PlanEnv:
        s = self.session
        return PlanEnv(job_dir=s.job_dir, threads=s.config.threads, memory_limit=s.config.memory_limit,
                       compression=s.config.compression, materialize=self.materialize, sink=self.sink,
                       storage=s.storage, workers=None if s.config.ray_address else s.config.num_executors)

    def execute(self, root: Node) -> List[DataSet]:
        plan = LogicalPlan(root.ctx, root)
        nodes = plan.nodes()
        todo = [n for n in nodes if n not in self.outputs or n.force_recompute]
        # a recomputed node invalidates what was built on it in this session
        stale = set(todo)
        for n in nodes:
            if any(d in stale for d in n.input_deps):
                stale.add(n)
                self.outputs.pop(n, None)
        todo = [n for n in nodes if n not in self.outputs or n.force_recompute]
        fused = self._fusions(nodes, todo, root)
        todo = [n for n in todo if n not in fused.values()]
        env = self.env()
        # shuffle files that a sink would publish as they are keep the output codec
        sunk = {d for n in nodes if isinstance(n, DataSinkNode) for d in n.input_deps}
        for k, node in enumerate(todo, 1):
            t0 = time.time()
            env.shuffle_compression = None if node in sunk else self.session.config.shuffle_compression
            if node in fused:  # shuffle reading its SQL input as a stream
                sql = fused[node]
                inputs = [self.outputs[d] for d in sql.input_deps]
                stage = node.plan(inputs, env, pre_query=sql.sql_query)
            else:
                inputs = [self.outputs[d] for d in node.input_deps]
                stage = node.plan(inputs, env)
            if node.force_recompute:
                for t in stage.tasks:
                    shutil.rmtree(t.out_dir, ignore_errors=True)
                node.force_recompute = False
            results = [load_manifest(t) for t in stage.tasks]
            missing = [i for i, r in enumerate(results) if r is None]
            stats = StageStats(node.name, t0, t0)
            if stage.tasks:
                bar = StageProgress(k, len(todo), node.name, len(stage.tasks), len(stage.tasks) - len(missing),
                                    self.session.config.progress)
                for i in missing:  # folders of attempts that died with an earlier run of the job
                    for stale in glob.glob(stage.tasks[i].out_dir + ".tmp-*"):
                        shutil.rmtree(stale, ignore_errors=True)
                if missing:
                    fresh = self.session.executor.run([stage.tasks[i] for i in missing],
                                                      on_done=lambda r: bar.update(r.num_rows))
                    for i, r in zip(missing, fresh):
                        results[i] = r
                bar.rows = sum(r.num_rows for r in results)
                bar.close()
                self.tasks_run += len(missing)
                self.tasks_cached += len(stage.tasks) - len(missing)
            self.outputs[node] = stage.finalize(results)
            stats.results, stats.end = results, time.time()
            self.stages.append(stats)
        self.session._write_report()
        return self.outputs[root]

    def _fusions(self, nodes, todo, root) -> Dict[Node, Node]:
        """Shuffles whose input is a SQL node used by nothing else: run that SQL inside the
        shuffle tasks instead of materialising it (saves a full write and read of the data)."""
        if not self.session.config.fuse:
            return {}
        consumers: Dict[Node, int] = {}
        for n in nodes:
            for d in n.input_deps:
                consumers[d] = consumers.get(d, 0) + 1
        out = {}
        for n in todo:
            sql = n.fusable_input() if hasattr(n, "fusable_input") else None
            if sql is not None and sql in todo and sql is not root and consumers.get(sql) == 1 \
                    and not sql.force_recompute and not n.force_recompute:
                out[n] = sql
        return out

    # -- services for nodes --------------------------------------------------------------------
    def materialize(self, ds: ArrowTableDataSet) -> ParquetDataSet:
        """Write an in-memory table once under the job's sources folder."""
        path = os.path.join(self.session.job_dir, "sources", ds.signature() + ".parquet")
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            pq.write_table(ds.table, tmp)
            os.replace(tmp, path)
        out = ParquetDataSet([path]).with_paths([path])
        out.schema = ds.table.schema
        return out

    def sink(self, parts: List[DataSet], output_path: str, kind: str) -> List[DataSet]:
        """Stage every partition's files beside ``output_path``, then move them in."""
        storage = self.session.storage
        target = os.path.abspath(storage.output_target(output_path))
        staging = f"{target.rstrip('/')}.__tmp_{uuid.uuid4().hex[:8]}"
        os.makedirs(staging)
        names_per_part: List[List[str]] = []
        try:
            manifest = []
            for i, ds in enumerate(parts):
                names = []
                plain = isinstance(ds, ParquetDataSet) and ds.row_ranges is None and not ds.columns and not ds.union_by_name
                if kind == "manifest":
                    manifest += ds.paths
                elif plain:
                    for j, src in enumerate(ds.paths):
                        names.append(f"part-{i:05d}-{j:04d}.parquet")
                        _place(src, os.path.join(staging, names[-1]), kind)
                elif not ds.empty:
                    names.append(f"part-{i:05d}-0000.parquet")
                    pq.write_table(ds.to_arrow_table(), os.path.join(staging, names[-1]))
                names_per_part.append(names)
            if kind == "manifest":
                with open(os.path.join(staging, "_manifest.txt"), "w") as f:
                    f.write("\n".join(manifest) + "\n")
            if not os.path.exists(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.rename(staging, target)
            else:
                for names in names_per_part:
                    for n in names:
                        os.replace(os.path.join(staging, n), os.path.join(target, n))
                if kind == "manifest":
                    os.replace(os.path.join(staging, "_manifest.txt"), os.path.join(target, "_manifest.txt"))
                shutil.rmtree(staging, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if kind == "manifest":
            return parts
        all_names = [n for names in names_per_part for n in names]
        storage.publish(output_path, target, all_names)
        out = []
        for ds, names in zip(parts, names_per_part):
            files = [os.path.join(target, n) for n in names]
            o = ParquetDataSet(files).with_paths(files)
            o.schema = ds.schema
            out.append(o)
        return out


def _place(src: str, dst: str, kind: str) -> None:
    if kind in ("link_or_copy", "link"):
        try:
            os.link(src, dst)
            return
        except OSError:
            if kind == "link":
                raise
    shutil.copyfile(src, dst)
