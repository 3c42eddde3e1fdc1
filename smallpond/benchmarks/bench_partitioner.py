"""Native hash partitioner vs DuckDB SQL per output partition.

(a) in memory: split an Arrow table of R rows into N tables by hash(key).
    ours:   smallpond._C hash + counting sort, then Arrow take/slice.
    duckdb: N queries ``select * from t where hash(k) % N = j`` (the per-partition SQL split),
            and a stronger variant that computes the partition id once into a temp table first.
(b) shuffle task on disk: HashPartitionNode(engine_type="native") vs engine_type="duckdb"
    (one COPY per output partition), same input files, same session.

usage: python bench_partitioner.py [--rows 4000000] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import git_commit, machine, print_table  # noqa: E402


def make_table(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"k": rng.integers(0, 1 << 40, rows), "v": rng.standard_normal(rows),
                     "s": pa.array(np.char.add("user", (rng.integers(0, 100000, rows)).astype(str)))})


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def in_memory(table: pa.Table, n: int, repeat: int) -> dict:
    import duckdb
    from smallpond import partition as P
    from smallpond.logical.dataset import _fetch_arrow
    batch = table.combine_chunks().to_batches()[0]
    ours = best_of(lambda: P.hash_partition_batch(batch, ["k"], n), repeat)
    parts = P.hash_partition_batch(batch, ["k"], n)
    assert sum(p.num_rows for p in parts) == table.num_rows
    con = duckdb.connect(config={"threads": 2})
    con.register("t", table)

    def per_partition():
        return [_fetch_arrow(con.sql(f"select * from t where hash(k) % {n} = {j}")) for j in range(n)]

    def precomputed():
        con.execute(f"create or replace temp table tp as select *, hash(k) % {n} as pid from t")
        return [_fetch_arrow(con.sql(f"select * exclude (pid) from tp where pid = {j}")) for j in range(n)]
    duck = best_of(per_partition, repeat)
    duck_pre = best_of(precomputed, repeat)
    return dict(case="in-memory split", rows=table.num_rows, n=n, ours_s=ours, duckdb_s=duck, duckdb_pre_s=duck_pre)


def on_disk(files, rows: int, n: int, work: str) -> dict:
    import smallpond
    from smallpond import Context, DataSourceNode, DataSetPartitionNode, HashPartitionNode, ParquetDataSet
    out = {}
    for engine in ("native", "duckdb"):
        root = os.path.join(work, f"root-{engine}-{n}")
        sp = smallpond.init(job_id="bench", data_root=root, num_executors=2, progress=False, report_format="none")
        try:
            ctx = Context()
            src = DataSourceNode(ctx, ParquetDataSet(files))
            parts = DataSetPartitionNode(ctx, (src,), npartitions=len(files))
            node = HashPartitionNode(ctx, (parts,), npartitions=n, hash_columns=["k"], engine_type=engine)
            sp.execute(parts)
            sp.from_items(list(range(4))).repartition(2, by_rows=True).map("item").count()  # start workers
            t0 = time.perf_counter()
            res = sp.execute(node)
            out[engine] = time.perf_counter() - t0
            assert sum(sum(d.num_rows_per_file()) for d in res) == rows
        finally:
            sp.shutdown()
            shutil.rmtree(root, ignore_errors=True)
    return dict(case="shuffle to parquet", rows=rows, n=n, ours_s=out["native"], duckdb_s=out["duckdb"], duckdb_pre_s=None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--partitions", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    table = make_table(args.rows)
    work = tempfile.mkdtemp(prefix="sp-bench-part-")
    results = []
    try:
        files = []
        per = args.rows // 4
        for i in range(4):
            files.append(os.path.join(work, f"in{i}.parquet"))
            pq.write_table(table.slice(i * per, per), files[-1])
        for n in args.partitions:
            results.append(in_memory(table, n, args.repeat))
            print(results[-1], flush=True)
        for n in args.partitions:
            results.append(on_disk(files, per * 4, n, work))
            print(results[-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for r in results:
        r["ratio"] = r["duckdb_s"] / r["ours_s"]
        r["mrows_per_s"] = r["rows"] / r["ours_s"] / 1e6
    print_table(f"hash partitioning, {args.rows:,} rows (int64 key, float64, string); {machine()}", results, [
        ("case", lambda r: r["case"], 20), ("N", lambda r: str(r["n"]), 6),
        ("ours s", lambda r: f"{r['ours_s']:.3f}", 10), ("ours Mrows/s", lambda r: f"{r['mrows_per_s']:.1f}", 14),
        ("duckdb per-part s", lambda r: f"{r['duckdb_s']:.3f}", 19),
        ("duckdb pid-table s", lambda r: "-" if r["duckdb_pre_s"] is None else f"{r['duckdb_pre_s']:.3f}", 20),
        ("speed-up", lambda r: f"{r['ratio']:.1f}x", 10)])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "partitioner", "machine": machine(), "commit": git_commit(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
