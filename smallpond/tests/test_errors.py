"""Bad input: clear errors, and no half-written output where the final output goes."""
import os
import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import smallpond
from smallpond import TaskError


def test_missing_file(sp_session, tmp_path):
    with pytest.raises(FileNotFoundError, match="no file found at .*nope.parquet"):
        sp_session.read_parquet(str(tmp_path / "nope.parquet")).count()


def test_schema_mismatch(sp_session, tmp_path):
    pq.write_table(pa.table({"a": [1], "b": ["x"]}), tmp_path / "1.parquet")
    pq.write_table(pa.table({"a": [1.5], "c": [2]}), tmp_path / "2.parquet")
    with pytest.raises(ValueError, match=r"schema mismatch between .*1.parquet.*and .*2.parquet.*union_by_name"):
        sp_session.read_parquet(str(tmp_path / "*.parquet")).count()


def test_sql_error_names_partition_and_query(sp_session, tmp_path):
    df = sp_session.from_items(list(range(20))).repartition(3, by_rows=True)
    bad = sp_session.partial_sql("select no_such_column from {0}", df)
    out = tmp_path / "out"
    with pytest.raises(TaskError, match=r"SqlEngineNode-\d+ partition \d of 3 failed.*no_such_column[\s\S]*query: select no_such_column"):
        bad.write_parquet(str(out))
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if "__tmp" in p]
    with pytest.raises(ValueError, match=r"uses \{1\} but only 1 input"):
        sp_session.partial_sql("select * from {0} join {1} using (item)", df)
    with pytest.raises(ValueError, match="same number of partitions"):
        sp_session.partial_sql("select * from {0}, {1}", df, sp_session.from_items([1]))


def test_partition_column_out_of_range(sp_session, tmp_path):
    df = sp_session.from_pandas(pd.DataFrame({"p": [0, 1, 7], "x": [1, 2, 3]})).repartition(3, by="p")
    with pytest.raises(TaskError, match=r"repartition\(by='p'\): .*row 2 has value 7, expected an id in \[0, 3\)"):
        df.write_parquet(str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()
    with pytest.raises(TaskError, match="must be an integer column"):
        sp_session.from_items(["a"]).repartition(2, by="item").count()


def test_non_serialisable_function(sp_session):
    lock = threading.Lock()
    df = sp_session.from_items([1, 2])
    with pytest.raises(TypeError, match="map: the function cannot be serialised"):
        df.map(lambda r: (lock.locked(), r)[1])
    with pytest.raises(TypeError, match="map_batches: the function cannot be serialised"):
        df.map_batches(lambda t: (lock.locked(), t)[1])
    with pytest.raises(TypeError, match="expected a SQL string or a callable"):
        df.filter(42)


def test_bad_arguments(sp_session, tmp_path):
    df = sp_session.from_items([1, 2])
    with pytest.raises(ValueError, match="npartitions: expected >= 1, got 0"):
        df.repartition(0)
    with pytest.raises(TypeError, match="npartitions: expected an int"):
        df.repartition("3")
    with pytest.raises(ValueError, match="give hash_by or by, not both"):
        df.repartition(2, hash_by="item", by="item")
    with pytest.raises(TypeError, match="hash_by"):
        df.repartition(2, hash_by=[1])
    with pytest.raises(TaskError, match="column 'zzz' not found"):
        df.repartition(2, hash_by="zzz").count()
    with pytest.raises(ValueError, match="limit: expected an int >= 0"):
        df.limit(-1)
    with pytest.raises(ValueError, match="batch_size"):
        df.map_batches(lambda t: t, batch_size=0)
    with pytest.raises(TypeError, match="schema must be a non-empty dict"):
        sp_session.read_csv(str(tmp_path / "x.csv"), schema=["a"])
    with pytest.raises(TypeError, match="paths: expected a path string"):
        sp_session.read_parquet(3)
    with pytest.raises(TypeError, match="unexpected keyword"):
        df.repartition(2, bogus=1)


def test_init_arguments_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SP_NUM_EXECUTORS", "3")
    monkeypatch.setenv("SP_DATA_ROOT", str(tmp_path / "env_root"))
    monkeypatch.setenv("SP_MEMORY_LIMIT", "1GB")
    monkeypatch.setenv("SP_JOBID", "from-env")
    sp = smallpond.init(num_executors=1, data_root=str(tmp_path / "arg_root"), memory_limit="256MiB", progress=False)
    try:  # explicit arguments win over SP_* variables
        assert sp.config.num_executors == 1 and sp.config.memory_limit == 256 << 20
        assert sp.config.data_root == str(tmp_path / "arg_root") and sp.config.job_id == "from-env"
    finally:
        sp.shutdown()
    sp = smallpond.init(progress=False)
    try:  # and the environment is used when no argument is given
        assert sp.config.num_executors == 3 and sp.config.memory_limit == 10**9
        assert sp.config.data_root == str(tmp_path / "env_root")
    finally:
        sp.shutdown()
    with pytest.raises(ValueError, match="num_executors: expected a positive int, got 0"):
        smallpond.init(num_executors=0)
    with pytest.raises(ValueError, match="memory_limit"):
        smallpond.init(memory_limit="lots")
    monkeypatch.setenv("SP_NUM_EXECUTORS", "many")
    with pytest.raises(ValueError, match="SP_NUM_EXECUTORS='many' is not valid"):
        smallpond.init()


def _flaky(marker_dir: str, fail_times: int):
    def fn(t: pa.Table) -> pa.Table:
        n = len(os.listdir(marker_dir))
        open(os.path.join(marker_dir, f"attempt{n}"), "w").close()
        if n < fail_times:
            raise OSError(f"transient failure {n}")
        return t
    return fn


def test_bounded_retries(tmp_path):
    sp = smallpond.init(job_id="retries", data_root=str(tmp_path / "root"), num_executors=1, max_retries=2,
                        progress=False)
    try:
        ok_dir, bad_dir = tmp_path / "ok", tmp_path / "bad"
        ok_dir.mkdir(), bad_dir.mkdir()
        df = sp.from_items([1, 2, 3])
        assert df.map_batches(_flaky(str(ok_dir), 2)).count() == 3  # succeeds on the 3rd attempt
        assert len(os.listdir(ok_dir)) == 3
        stage = sp.stages[-1]
        assert stage.results[0].attempts == 3
        with pytest.raises(TaskError, match="transient failure 2 .*gave up after 3 attempts"):
            df.map_batches(_flaky(str(bad_dir), 10)).count()
        assert len(os.listdir(bad_dir)) == 3  # 1 try + max_retries
    finally:
        sp.shutdown()


def test_worker_killed_is_retried(tmp_path):
    sp = smallpond.init(job_id="kill", data_root=str(tmp_path / "root"), num_executors=1, max_retries=1,
                        progress=False)
    marker = tmp_path / "killed"

    def die_once(t: pa.Table) -> pa.Table:
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(9)  # the worker process dies abruptly
        return t
    try:
        assert sp.from_items(list(range(5))).map_batches(die_once).count() == 5
    finally:
        sp.shutdown()


def test_spills_when_partition_exceeds_memory(tmp_path):
    # a sort whose data is several times the per-task memory limit succeeds by spilling to disk
    sp = smallpond.init(job_id="spill", data_root=str(tmp_path / "root"), num_executors=1, memory_limit="40MB",
                        cpu_limit=1, progress=False)
    try:
        n = 1_500_000
        rng = np.random.default_rng(0)
        t = pa.table({"k": rng.permutation(n), "pad": pa.array(np.full(n, "x" * 40))})
        df = sp.from_arrow(t).partial_sort(by="k")
        assert df.count() == n
        out = pq.read_table(sp.execute(df.plan)[0].paths[0], columns=["k"]).column("k").to_numpy()
        assert np.array_equal(out, np.arange(n))
        nospill = sp.partial_sql("select * from {0} order by k", sp.from_arrow(t), enable_temp_directory=False)
        with pytest.raises(TaskError, match="(?i)out of memory|memory"):
            nospill.count()
    finally:
        sp.shutdown()
