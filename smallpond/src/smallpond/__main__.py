"""``python -m smallpond``: a partitioned pipeline on generated data, verified against DuckDB.

read parquet -> hash repartition by customer -> partial SQL aggregation -> sorted write.
The last line is ``summary: backend=CPU result=...`` (exit code 0 on success).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ._version import __version__


def generate(folder: str, rows: int, files: int, seed: int = 0) -> list:
    """Orders: customer (int64, skewed), region (string, some nulls), amount (float64), ts (timestamp)."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    paths = []
    per = rows // files
    for i in range(files):
        n = per if i < files - 1 else rows - per * (files - 1)
        customer = (rng.zipf(1.3, n) % 5000).astype(np.int64)
        regions = np.array(["north", "south", "east", "west", "centre"])
        region = pa.array(regions[rng.integers(0, 5, n)], mask=rng.random(n) < 0.02)
        t = pa.table({"customer": customer, "region": region, "amount": rng.gamma(2.0, 30.0, n).round(2),
                      "ts": pa.array(rng.integers(1.6e9, 1.7e9, n) * 1_000_000, pa.timestamp("us"))})
        p = os.path.join(folder, f"orders-{i:03d}.parquet")
        pq.write_table(t, p)
        paths.append(p)
    return paths


AGG = ("select customer, count(*) as orders, round(sum(amount), 2) as total, count(region) as with_region, "
       "min(ts) as first_order from {0} group by customer")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m smallpond", description=__doc__.splitlines()[0])
    ap.add_argument("--version", action="store_true", help="print the version and exit")
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--num-executors", type=int, default=None)
    ap.add_argument("--data-root", default=None, help="default: a temporary folder, removed at the end")
    ap.add_argument("--ray-address", default=None)
    args = ap.parse_args(argv)
    if args.version:
        print(f"smallpond {__version__}")
        return 0
    import duckdb
    import smallpond

    work = args.data_root or tempfile.mkdtemp(prefix="smallpond-demo-")
    try:
        t0 = time.time()
        paths = generate(os.path.join(work, "input"), args.rows, args.files)
        print(f"generated {args.rows:,} orders in {len(paths)} parquet files ({time.time() - t0:.2f}s)")
        sp = smallpond.init(job_id="demo", data_root=os.path.join(work, "root"), num_executors=args.num_executors,
                            ray_address=args.ray_address, progress=False)
        try:
            t1 = time.time()
            df = sp.read_parquet(os.path.join(work, "input", "*.parquet"))
            df = df.repartition(args.files)                               # one partition per file
            df = df.repartition(args.partitions, hash_by="customer")      # native hash shuffle
            df = sp.partial_sql(AGG, df)                                  # per-partition DuckDB
            df = sp.partial_sql("select * from {0} order by total desc, customer", df.repartition(1))
            out = os.path.join(work, "output")
            df.write_parquet(out)
            elapsed = time.time() - t1
            print(f"\n{'stage':<36}{'tasks':>6}{'rows out':>12}{'seconds':>10}")
            for s in sp.stages:
                rows = f"{s.rows:,}" if s.results else "-"
                print(f"{s.name:<36}{len(s.results):>6}{rows:>12}{s.end - s.start:>10.3f}")
            report = sp.report()
            print(f"pipeline: {elapsed:.2f}s on {sp.config.num_executors} executor(s)"
                  + (f"; report: {report}" if args.data_root else ""))
        finally:
            sp.shutdown()
        got = pq.read_table(out).to_pandas()
        glob = os.path.join(work, "input", "*.parquet")
        want = duckdb.sql(AGG.format(f"read_parquet('{glob}')") + " order by total desc, customer").df()
        ok = (len(got) == len(want) and got.customer.tolist() == want.customer.tolist()
              and got.orders.tolist() == want.orders.tolist()
              and np.allclose(got.total.to_numpy(), want.total.to_numpy(), rtol=1e-9, atol=1e-6)
              and got.with_region.tolist() == want.with_region.tolist()
              and got.first_order.tolist() == want.first_order.tolist())
        rows_in = int(want.orders.sum())
        print(f"verify against DuckDB on the same files: {'OK' if ok else 'MISMATCH'} "
              f"({rows_in:,} rows -> {len(got):,} customers)")
        result = f"pipeline matches DuckDB ({rows_in} rows, {len(got)} groups)" if ok else "MISMATCH against DuckDB"
        print(f"summary: backend=CPU result={result}")
        return 0 if ok else 1
    finally:
        if args.data_root is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
