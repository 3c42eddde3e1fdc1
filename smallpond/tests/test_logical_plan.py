"""Plans built directly from logical nodes, as the original's low-level API allows."""
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from smallpond import (ArrowComputeNode, ConsolidateNode, Context, DataSetPartitionNode, DataSinkNode,
                       DataSourceNode, EvenlyDistributedPartitionNode, HashPartitionNode, LogicalPlan,
                       PandasComputeNode, ParquetDataSet, SqlEngineNode)


class CountPerKey(ArrowComputeNode):
    def process(self, runtime_ctx, input_tables):
        t = input_tables[0]
        keys, counts = np.unique(t.column("k").to_numpy(), return_counts=True)
        return pa.table({"k": keys, "n": counts, "part": np.full(len(keys), runtime_ctx.partition)})


def test_plan_with_nodes(sp_session, tmp_path):
    rng = np.random.default_rng(11)
    frames = []
    for i in range(6):
        f = pd.DataFrame({"k": rng.integers(0, 25, 500), "v": rng.random(500)})
        pq.write_table(pa.Table.from_pandas(f, preserve_index=False), tmp_path / f"in{i}.parquet")
        frames.append(f)
    pdf = pd.concat(frames, ignore_index=True)
    ctx = Context()
    src = DataSourceNode(ctx, ParquetDataSet([str(tmp_path / "in*.parquet")]))
    parts = DataSetPartitionNode(ctx, (src,), npartitions=3)
    hashed = HashPartitionNode(ctx, (parts,), npartitions=4, hash_columns=["k"])
    counted = CountPerKey(ctx, (hashed,))
    doubled = PandasComputeNode(ctx, (counted,), process_func=lambda rc, dfs: dfs[0].assign(n2=dfs[0].n * 2))
    summed = SqlEngineNode(ctx, (ConsolidateNode(ctx, doubled),), "select k, sum(n2) as n2 from {0} group by k order by k")
    out = tmp_path / "out"
    plan = LogicalPlan(ctx, DataSinkNode(ctx, (summed,), str(out)))
    assert "HashPartitionNode" in str(plan)
    result = sp_session.execute(plan)
    got = pq.read_table(result[0].paths[0]).to_pandas()
    want = pdf.groupby("k").size().mul(2).reset_index(name="n2")
    assert got.k.tolist() == want.k.tolist() and got.n2.tolist() == want.n2.tolist()
    # every key was counted in exactly one hash partition
    per_part = pd.concat([pq.read_table(p).to_pandas() for ds in sp_session.execute(counted) for p in ds.paths])
    assert per_part.k.is_unique


def test_evenly_distributed_and_duckdb_engine(sp_session, tmp_path):
    t = pa.table({"k": np.arange(1000) % 17, "x": np.arange(1000)})
    for i in range(5):
        pq.write_table(t.slice(i * 200, 200), tmp_path / f"p{i}.parquet")
    ctx = Context()
    src = DataSourceNode(ctx, ParquetDataSet([str(tmp_path / f"p{i}.parquet") for i in range(5)]))
    even = EvenlyDistributedPartitionNode(ctx, (src,), npartitions=7)  # more partitions than files
    parts = sp_session.execute(even)
    assert sum(len(p.paths) for p in parts) == 5 and sum(p.empty for p in parts) == 2
    sql = sp_session.execute(SqlEngineNode(ctx, (even,), "select count(*) as c from {0}"))
    assert sorted(pq.read_table(d.paths[0]).column("c")[0].as_py() for d in sql) == [0, 0, 200, 200, 200, 200, 200]
    native = HashPartitionNode(ctx, (even,), npartitions=4, hash_columns=["k"])
    duck = HashPartitionNode(ctx, (even,), npartitions=4, hash_columns=["k"], engine_type="duckdb")
    for node in (native, duck):
        out = sp_session.execute(node)
        owner = {}
        total = 0
        for j, ds in enumerate(out):
            tab = ds.to_arrow_table()
            total += tab.num_rows
            for k in set(tab.column("k").to_pylist()):
                assert owner.setdefault(k, j) == j
        assert total == 1000


def test_node_bad_input():
    ctx = Context()
    src = DataSourceNode(ctx, ParquetDataSet(["x.parquet"]))
    with pytest.raises(TypeError, match="ctx: expected a smallpond Context"):
        SqlEngineNode(None, (src,), "select 1")
    with pytest.raises(TypeError, match="input_deps"):
        SqlEngineNode(ctx, ("nope",), "select 1")
    with pytest.raises(ValueError, match="exactly one of hash_columns"):
        HashPartitionNode(ctx, (src,), 3)
    with pytest.raises(ValueError, match="engine_type"):
        HashPartitionNode(ctx, (src,), 3, hash_columns=["a"], engine_type="spark")
    with pytest.raises(ValueError, match="give process_func or override process"):
        ArrowComputeNode(ctx, (src,))
    with pytest.raises(TypeError, match="dataset: expected a smallpond DataSet"):
        DataSourceNode(ctx, "x.parquet")
    with pytest.raises(ValueError, match="placeholders must be"):
        SqlEngineNode(ctx, (src,), "select * from {name}")
