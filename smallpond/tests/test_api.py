"""Every DataFrame / Session call on small generated data, against pandas or DuckDB directly."""
import datetime as dt
import json
import os

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest


def _frame(seed: int, n: int = 2000) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"k": rng.integers(0, 40, n), "v": rng.standard_normal(n),
                         "s": [f"s{i % 13}" for i in range(n)]})


def _files(tmp_path, df: pd.DataFrame, nfiles: int, name="data"):
    d = tmp_path / name
    d.mkdir()
    paths = []
    bounds = np.linspace(0, len(df), nfiles + 1).astype(int)
    for i in range(nfiles):
        chunk = df.iloc[bounds[i]:bounds[i + 1]]
        p = d / f"part{i}.parquet"
        pq.write_table(pa.Table.from_pandas(chunk, preserve_index=False), p)
        paths.append(str(p))
    return d, paths


def _sorted(df: pd.DataFrame, by) -> pd.DataFrame:
    return df.sort_values(by).reset_index(drop=True)


def test_read_parquet_repartition_hash_partial_sql(sp_session, tmp_path):
    pdf = _frame(1)
    d, paths = _files(tmp_path, pdf, 4)
    df = sp_session.read_parquet(str(d / "*.parquet"))
    df = df.repartition(3).repartition(5, hash_by="k")
    parts = sp_session.execute(df.plan)
    owner = {}
    for j, ds in enumerate(parts):
        for k in set(ds.to_arrow_table().column("k").to_pylist()):
            assert owner.setdefault(k, j) == j
    agg = sp_session.partial_sql("select k, sum(v) as sv, count(*) as n from {0} group by k", df)
    got = _sorted(agg.to_pandas(), "k")
    want = pdf.groupby("k").agg(sv=("v", "sum"), n=("v", "size")).reset_index()
    assert got.k.tolist() == want.k.tolist() and got.n.tolist() == want.n.tolist()
    np.testing.assert_allclose(got.sv, want.sv, rtol=1e-9, atol=1e-9)
    assert agg.count() == pdf.k.nunique()


def test_read_parquet_options(sp_session, tmp_path):
    pdf = _frame(2, 300)
    d, _ = _files(tmp_path, pdf, 2)
    sub = d / "nested"
    sub.mkdir()
    pq.write_table(pa.Table.from_pandas(pdf.head(10), preserve_index=False), sub / "x.parquet")
    assert sp_session.read_parquet(str(d)).count() == 300
    assert sp_session.read_parquet(str(d), recursive=True).count() == 310
    got = sp_session.read_parquet(str(d / "*.parquet"), columns=["k"]).to_pandas()
    assert list(got.columns) == ["k"] and got.k.tolist() == pdf.k.tolist()
    extra = tmp_path / "extra.parquet"
    pq.write_table(pa.table({"k": [1, 2], "w": [0.5, 1.5]}), extra)
    u = sp_session.read_parquet([str(d / "part0.parquet"), str(extra)], union_by_name=True).to_pandas()
    assert set(u.columns) == {"k", "v", "s", "w"} and len(u) == 152 and u.w.notna().sum() == 2


def test_read_csv_and_json(sp_session, tmp_path):
    pdf = _frame(3, 200)
    csv = tmp_path / "a.csv"
    pdf.to_csv(csv, index=False, header=False, sep="|")
    df = sp_session.read_csv(str(csv), schema={"k": "BIGINT", "v": "DOUBLE", "s": "VARCHAR"}, delim="|")
    got = df.to_pandas()
    pd.testing.assert_frame_equal(got, pdf, check_dtype=False)
    js = tmp_path / "a.json"
    js.write_text("".join(json.dumps(r) + "\n" for r in pdf.to_dict("records")))
    got = sp_session.read_json(str(js), schema={"k": "BIGINT", "v": "DOUBLE", "s": "VARCHAR"}).to_pandas()
    pd.testing.assert_frame_equal(got, pdf, check_dtype=False)
    # split by rows works on CSV too (converted to Parquet first)
    parts = sp_session.execute(df.repartition(3, by_rows=True).plan)
    assert [p.to_arrow_table().num_rows for p in parts] == [66, 67, 67]


def test_from_items_pandas_arrow(sp_session):
    assert sp_session.from_items([1, 2, 3]).take_all() == [{"item": 1}, {"item": 2}, {"item": 3}]
    assert sp_session.from_items([{"a": 1, "b": "x"}, {"a": 2, "b": None}]).to_arrow().column("b").to_pylist() == ["x", None]
    pdf = _frame(4, 50)
    pd.testing.assert_frame_equal(sp_session.from_pandas(pdf).to_pandas(), pdf)
    t = pa.Table.from_pandas(pdf, preserve_index=False)
    assert sp_session.from_arrow(t).to_arrow().equals(t)


def test_repartition_by_column_and_even(sp_session):
    pdf = pd.DataFrame({"p": np.arange(100) % 4, "x": np.arange(100)})
    df = sp_session.from_pandas(pdf).repartition(4, by="p")
    parts = sp_session.execute(df.plan)
    for j, ds in enumerate(parts):
        assert set(ds.to_arrow_table().column("p").to_pylist()) == {j}
    rows = sp_session.from_pandas(pdf).repartition(3, by_rows=True)
    sizes = [ds.to_arrow_table().num_rows for ds in sp_session.execute(rows.plan)]
    assert sizes == [33, 33, 34]
    assert rows.to_pandas().x.tolist() == list(range(100))  # order kept across partitions
    assert rows.count() == 100
    dropped = sp_session.from_pandas(pdf).repartition(4, by="p", drop_partition_column=True)
    assert dropped.to_pandas().columns.tolist() == ["x"]


def test_partial_sql_two_inputs_join(sp_session):
    a = _frame(5, 500)
    b = pd.DataFrame({"k": np.arange(40), "name": [f"n{i}" for i in range(40)]})
    da = sp_session.from_pandas(a).repartition(4, hash_by="k")
    db = sp_session.from_pandas(b).repartition(4, hash_by="k")
    j = sp_session.partial_sql("select a.k, a.v, b.name from {0} a join {1} b on a.k = b.k", da, db)
    got = _sorted(j.to_pandas(), ["k", "v"])
    want = _sorted(a.merge(b, on="k")[["k", "v", "name"]], ["k", "v"])
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_sort_shuffle_filter_map(sp_session):
    pdf = _frame(6, 1000)
    df = sp_session.from_pandas(pdf).repartition(3, by_rows=True)
    sorted_parts = sp_session.execute(df.partial_sort(by=["k", "v"]).plan)
    for ds in sorted_parts:
        t = ds.to_arrow_table().to_pandas()
        pd.testing.assert_frame_equal(t, _sorted(t, ["k", "v"]))
    sh = df.random_shuffle().to_pandas()
    pd.testing.assert_frame_equal(_sorted(sh, ["k", "v"]), _sorted(pdf, ["k", "v"]))
    assert not sh.v.equals(pdf.v)
    f1 = df.filter("k < 10 and v > 0").to_pandas()
    f2 = df.filter(lambda r: r["k"] < 10 and r["v"] > 0).to_pandas()
    want = pdf[(pdf.k < 10) & (pdf.v > 0)].reset_index(drop=True)
    pd.testing.assert_frame_equal(f1, want)
    pd.testing.assert_frame_equal(f2, want)
    m1 = df.map("k * 2 as k2, upper(s) as s").to_pandas()
    m2 = df.map(lambda r: {"k2": r["k"] * 2, "s": r["s"].upper()},
                schema=pa.schema([("k2", pa.int64()), ("s", pa.string())])).to_pandas()
    assert m1.k2.tolist() == (pdf.k * 2).tolist() == m2.k2.tolist()
    assert m1.s.tolist() == pdf.s.str.upper().tolist() == m2.s.tolist()


def test_flat_map_map_batches_limit_take(sp_session):
    pdf = pd.DataFrame({"id": np.arange(30), "n": np.arange(30) % 3})
    df = sp_session.from_pandas(pdf).repartition(2, by_rows=True)
    fm = df.flat_map(lambda r: [{"id": r["id"], "j": j} for j in range(r["n"])]).to_pandas()
    assert len(fm) == int(pdf.n.sum())
    fs = sp_session.from_items([{"xs": [1, 2, 3]}, {"xs": []}, {"xs": [4]}]).flat_map("unnest(xs) as x").to_pandas()
    assert fs.x.tolist() == [1, 2, 3, 4]
    seen = []

    def double(t: pa.Table) -> pa.Table:
        assert t.num_rows <= 4
        return t.set_column(1, "n", pa.compute.multiply(t.column("n"), 2))
    mb = df.map_batches(double, batch_size=4).to_pandas()
    assert mb.n.tolist() == (pdf.n * 2).tolist()
    assert df.limit(7).count() == 7
    assert df.take(3) == pdf.head(3).to_dict("records")
    assert len(df.take_all()) == 30 and df.count() == 30


def test_empty_partitions_skew_and_rich_types(sp_session):
    n = 300
    t = pa.table({
        "k": pa.array([0] * 290 + list(range(1, 11)), pa.int64()),         # skewed key
        "s": pa.array([None if i % 7 == 0 else f"str{i}" for i in range(n)]),
        "l": pa.array([[i, i + 1] if i % 5 else None for i in range(n)], pa.list_(pa.int32())),
        "ts": pa.array([dt.datetime(2024, 1, 1) + dt.timedelta(seconds=i) for i in range(n)], pa.timestamp("us")),
        "f": pa.array([None if i % 11 == 0 else i / 3 for i in range(n)]),
    })
    df = sp_session.from_arrow(t).repartition(16, hash_by="k")
    parts = sp_session.execute(df.plan)
    sizes = [ds.to_arrow_table().num_rows for ds in parts]
    assert sum(sizes) == n and 0 in sizes  # some partitions are empty
    got = df.to_arrow().sort_by([("ts", "ascending")])
    assert got.equals(t.select(got.column_names))
    agg = sp_session.partial_sql("select k, count(*) as n, count(s) as ns, sum(len(l)) as nl from {0} group by k", df)
    got = agg.to_pandas().sort_values("k").reset_index(drop=True)
    want = duckdb.sql("select k, count(*) as n, count(s) as ns, sum(len(l)) as nl from t group by k order by k").df()
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_write_parquet_and_recompute(sp_session, tmp_path):
    pdf = _frame(7, 400)
    df = sp_session.from_pandas(pdf).repartition(4, hash_by="k")
    out = tmp_path / "out"
    df.write_parquet(str(out))
    files = sorted(os.listdir(out))
    assert len(files) == 4 and all(f.endswith(".parquet") for f in files)
    back = duckdb.sql(f"select * from read_parquet('{out}/*.parquet')").df()
    pd.testing.assert_frame_equal(_sorted(back, ["k", "v"]), _sorted(pdf, ["k", "v"]))
    assert not [p for p in os.listdir(tmp_path) if "__tmp" in p]
    before = sp_session._driver.tasks_run
    df.count()
    assert sp_session._driver.tasks_run == before  # cached
    df.recompute().count()
    assert sp_session._driver.tasks_run == before + 1


def test_report_and_progress(sp_session, tmp_path, capsys):
    sp_session.config.progress = True
    try:
        sp_session.from_items(list(range(10))).repartition(2, hash_by="item").count()
    finally:
        sp_session.config.progress = False
    err = capsys.readouterr().err
    assert "HashPartitionNode" in err and "1/1 tasks" in err and "10 rows" in err  # one line per stage
    html = open(sp_session.report()).read()
    assert "HashPartitionNode" in html and "<svg" in html
    png = sp_session.report(str(tmp_path / "r.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_sql_fused_into_shuffle_matches_unfused(tmp_path):
    import smallpond
    pdf = _frame(8, 3000)
    outs = {}
    for fuse in (True, False):
        sp = smallpond.init(job_id=f"fuse{fuse}", data_root=str(tmp_path), num_executors=2, progress=False, fuse=fuse)
        try:
            df = sp.from_pandas(pdf).repartition(3, by_rows=True)
            df = sp.partial_sql("select k, v * 2 as v2, k % 4 as bucket from {0} where v > -1", df)
            df = df.repartition(4, by="bucket")
            res = sp.execute(df.plan)
            outs[fuse] = [ds.to_arrow_table().to_pandas() for ds in res]
            names = [s.name.split("-")[0] for s in sp.stages]
            assert ("SqlEngineNode" in names) == (not fuse)  # fused: no separate SQL stage
        finally:
            sp.shutdown()
    for a, b in zip(outs[True], outs[False]):
        pd.testing.assert_frame_equal(_sorted(a, ["k", "v2"]), _sorted(b, ["k", "v2"]))
    want = pdf[pdf.v > -1]
    assert sum(len(p) for p in outs[True]) == len(want)
    for j, p in enumerate(outs[True]):
        assert set(p.bucket) <= {j}
