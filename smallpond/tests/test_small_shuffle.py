"""Small shuffles: several input partitions share one task; the output must not change."""
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import smallpond
from smallpond.execution.task import TaskError
from smallpond.logical import node as N


def _files(folder, nfiles=8, bad_file=None):
    rng = np.random.default_rng()
    paths = []
    for i in range(nfiles):
        n = 0 if i == 2 else int(rng.integers(200, 900))  # file 2 is empty
        k = rng.integers(0, 50, n)
        s = pa.array([None if x % 7 == 0 else str(x) for x in k], pa.string())
        if i == bad_file and n:
            s = pa.array(["x"] * n)
        t = pa.table({"k": k, "v": rng.standard_normal(n), "s": s})
        paths.append(os.path.join(folder, f"in-{i}.parquet"))
        pq.write_table(t, paths[-1])
    return paths


def _run(tmp_path, files, job, build):
    sp = smallpond.init(job_id=job, data_root=str(tmp_path / "root"), num_executors=2, progress=False,
                        report_format="none")
    try:
        res = sp.execute(build(sp).plan)
        tables = [ds.to_arrow_table() for ds in res]
        shuffle = [s for s in sp.stages if s.name.startswith("HashPartitionNode")]
        return tables, [len(s.results) for s in shuffle]
    finally:
        sp.shutdown()


@pytest.mark.parametrize("fused", [True, False])
def test_batched_shuffle_same_partitions(tmp_path, monkeypatch, fused):
    files = _files(str(tmp_path))

    def build(sp):
        df = sp.read_parquet(files).repartition(8)
        if fused:
            df = sp.partial_sql("select k, v, cast(s as bigint) as s from {0} where v > -1", df)
        return df.repartition(4, hash_by="k")

    batched, ntasks = _run(tmp_path, files, "batched", build)
    assert ntasks == [2]  # 8 small input partitions, 2 workers: 2 tasks of 4
    monkeypatch.setattr(N, "SMALL_SHUFFLE_TASK_BYTES", 1)  # one task per input partition
    plain, ntasks = _run(tmp_path, files, "plain", build)
    assert ntasks == [8]
    for a, b in zip(batched, plain):  # same rows, same order, in every output partition
        assert a.equals(b), (a.to_pandas(), b.to_pandas())
    want = pd.concat([pq.read_table(f).to_pandas() for f in files])
    if fused:
        want = want[want.v > -1]
    assert sum(t.num_rows for t in batched) == len(want)
    for j, t in enumerate(batched):  # equal keys together, in the partition of their hash
        others = set().union(*(set(x.column("k").to_pylist()) for i, x in enumerate(batched) if i != j))
        assert not set(t.column("k").to_pylist()) & others


def test_batched_shuffle_error_names_partition(tmp_path):
    files = _files(str(tmp_path), bad_file=5)
    sp = smallpond.init(job_id="bad", data_root=str(tmp_path / "root"), num_executors=2, progress=False,
                        report_format="none")
    try:
        df = sp.partial_sql("select k, cast(s as bigint) as s from {0}", sp.read_parquet(files).repartition(8))
        with pytest.raises(TaskError) as e:
            df.repartition(4, hash_by="k").count()
        assert "partition 5 of 8" in str(e.value) and "cast(s as bigint)" in str(e.value)
    finally:
        sp.shutdown()


def _codecs(path):
    md = pq.read_metadata(path)
    return {md.row_group(g).column(c).compression for g in range(md.num_row_groups) for c in range(md.num_columns)}


def test_shuffle_compression(tmp_path):
    files = _files(str(tmp_path))
    with pytest.raises(ValueError, match="shuffle_compression"):
        smallpond.init(data_root=str(tmp_path / "r0"), num_executors=1, shuffle_compression="zip")
    sp = smallpond.init(job_id="codec", data_root=str(tmp_path / "root"), num_executors=2, progress=False,
                        report_format="none")
    try:
        shuffled = sp.read_parquet(files).repartition(8).repartition(3, hash_by="k")
        inner = [p for ds in sp.execute(shuffled.plan) for p in ds.paths]
        assert inner and all(_codecs(p) == {"UNCOMPRESSED"} for p in inner if pq.read_metadata(p).num_rows)
        out = str(tmp_path / "out")
        sp.read_parquet(files).repartition(8).repartition(3, hash_by="k").write_parquet(out)
        written = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".parquet")]
        assert written and all(_codecs(p) == {"SNAPPY"} for p in written if pq.read_metadata(p).num_rows)
        assert pq.read_table(written).num_rows == sum(pq.read_metadata(f).num_rows for f in files)
    finally:
        sp.shutdown()


def test_batched_shuffle_resumes(tmp_path):
    files = _files(str(tmp_path))
    outs = []
    for attempt in range(2):  # the second session, same job, finds every batched task finished
        sp = smallpond.init(job_id="resume", data_root=str(tmp_path / "root"), num_executors=2, progress=False,
                            report_format="none")
        try:
            df = sp.partial_sql("select k, v from {0}", sp.read_parquet(files).repartition(8))
            res = sp.execute(df.repartition(4, hash_by="k").plan)
            outs.append([ds.to_arrow_table() for ds in res])
            assert sp._driver.tasks_run == (2 if attempt == 0 else 0)
        finally:
            sp.shutdown()
    assert all(a.equals(b) for a, b in zip(*outs))
