"""TPC-H-style aggregation over a generated ``lineitem`` table, expressed with partial_sql.

DuckDB's tpch extension is not available offline here, so ``lineitem`` comes from our own numpy
generator (TPC-H column set and value ranges; SF 1 = 6,001,215 rows, like dbgen).
Queries:
  Q1   pricing summary: per-partition partial aggregates, then a final merge (no shuffle).
  Q18  large-volume orders: group by l_orderkey having sum(l_quantity) > 250: partial sums per
       input partition, repartition(N, hash_by="l_orderkey") (a shuffle), final sums.
Systems, each in its own process: ours, original smallpond 0.15.0 (same DataFrame code),
DuckDB in one process, Polars in one process; optionally ``ours-before`` (this package with
small-shuffle batching off and snappy shuffle files, as before those changes). Results are
cross-checked.

Times are medians over --repeat runs in one process per system (per-run times in the JSON).

usage: python bench_tpch.py [--sf 1] [--repeat 7] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ORIG_PYTHON, emit, git_commit, machine, print_table, run_worker  # noqa: E402

ROWS_SF1 = 6_001_215

Q1_FILTER = "l_shipdate <= date '1998-09-02'"
Q1_PARTIAL = f"""select l_returnflag, l_linestatus, sum(l_quantity) as sum_qty, sum(l_extendedprice) as sum_base_price,
  sum(l_extendedprice * (1 - l_discount)) as sum_disc_price,
  sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) as sum_charge, sum(l_discount) as sum_disc,
  count(*) as count_order
from {{0}} where {Q1_FILTER} group by l_returnflag, l_linestatus"""
Q1_FINAL = """select l_returnflag, l_linestatus, sum(sum_qty) as sum_qty, sum(sum_base_price) as sum_base_price,
  sum(sum_disc_price) as sum_disc_price, sum(sum_charge) as sum_charge,
  sum(sum_qty) / sum(count_order) as avg_qty, sum(sum_base_price) / sum(count_order) as avg_price,
  sum(sum_disc) / sum(count_order) as avg_disc, sum(count_order) as count_order
from {0} group by l_returnflag, l_linestatus order by l_returnflag, l_linestatus"""
Q1_SINGLE = f"""select l_returnflag, l_linestatus, sum(l_quantity) as sum_qty, sum(l_extendedprice) as sum_base_price,
  sum(l_extendedprice * (1 - l_discount)) as sum_disc_price,
  sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) as sum_charge,
  avg(l_quantity) as avg_qty, avg(l_extendedprice) as avg_price, avg(l_discount) as avg_disc, count(*) as count_order
from {{0}} where {Q1_FILTER} group by l_returnflag, l_linestatus order by l_returnflag, l_linestatus"""
Q18 = "select l_orderkey, sum(l_quantity) as qty from {0} group by l_orderkey having sum(l_quantity) > 250"
Q18_PARTIAL = "select l_orderkey, sum(l_quantity) as qty from {0} group by l_orderkey"
Q18_FINAL = "select l_orderkey, sum(qty) as qty from {0} group by l_orderkey having sum(qty) > 250"


# -- data --------------------------------------------------------------------------------------
def generate(folder: str, sf: float, nfiles: int, seed: int = 7):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = int(ROWS_SF1 * sf)
    lines = rng.integers(1, 8, rows // 3 + 8)                     # 1..7 lines per order (mean 4)
    order_of_line = np.repeat(np.arange(1, len(lines) + 1), lines)[:rows]
    linenumber = (np.arange(rows) - np.searchsorted(order_of_line, order_of_line)) + 1
    orderkey = order_of_line * 4 - 3                                 # sparse keys, like dbgen
    words = ["carefully", "final", "deposits", "quickly", "ironic", "pending", "requests", "furiously",
             "express", "accounts", "blithely", "regular", "packages", "slyly", "bold", "even", "theodolites"]
    pool = pa.array([" ".join(rng.choice(words, rng.integers(2, 6))) for _ in range(4096)])
    base = np.datetime64("1992-01-02")
    files, start = [], 0
    for i in range(nfiles):
        n = rows // nfiles if i < nfiles - 1 else rows - start
        sl = slice(start, start + n)
        qty = rng.integers(1, 51, n).astype(np.float64)
        price = np.round(qty * rng.uniform(900, 2000, n), 2)
        ship = base + rng.integers(0, 2526, n).astype("timedelta64[D]")
        receipt = ship + rng.integers(1, 31, n).astype("timedelta64[D]")
        cutoff = np.datetime64("1995-06-17")
        rflag = np.where(receipt <= cutoff, np.where(rng.random(n) < 0.5, "R", "A"), "N")
        t = pa.table({
            "l_orderkey": orderkey[sl], "l_partkey": rng.integers(1, int(200_000 * sf) + 2, n),
            "l_suppkey": rng.integers(1, int(10_000 * sf) + 2, n), "l_linenumber": linenumber[sl].astype(np.int32),
            "l_quantity": qty, "l_extendedprice": price, "l_discount": rng.integers(0, 11, n) / 100.0,
            "l_tax": rng.integers(0, 9, n) / 100.0, "l_returnflag": rflag,
            "l_linestatus": np.where(ship > cutoff, "O", "F"),
            "l_shipdate": ship, "l_commitdate": ship + rng.integers(-30, 31, n).astype("timedelta64[D]"),
            "l_receiptdate": receipt,
            "l_shipinstruct": pa.array(["DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN"]).take(rng.integers(0, 4, n)),
            "l_shipmode": pa.array(["REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB"]).take(rng.integers(0, 7, n)),
            "l_comment": pool.take(rng.integers(0, len(pool), n)),
        })
        t = t.set_column(10, "l_shipdate", t.column("l_shipdate").cast(pa.date32()))
        t = t.set_column(11, "l_commitdate", t.column("l_commitdate").cast(pa.date32()))
        t = t.set_column(12, "l_receiptdate", t.column("l_receiptdate").cast(pa.date32()))
        files.append(os.path.join(folder, f"lineitem-{i:03d}.parquet"))
        pq.write_table(t, files[-1])
        start += n
    return files, rows


# -- systems (worker mode) ---------------------------------------------------------------------
def _q1_rows(df) -> list:
    cols = ["l_returnflag", "l_linestatus", "sum_qty", "sum_base_price", "sum_disc_price", "sum_charge",
            "avg_qty", "avg_price", "avg_disc", "count_order"]
    return [[r[c] if isinstance(r[c], str) else float(r[c]) for c in cols] for r in df.to_dict("records")]


def run_smallpond(files, nparts, work, kind, repeat=1):
    import shutil as _sh
    import smallpond
    t0 = time.perf_counter()
    if kind in ("ours", "ours-before"):
        extra = {}
        if kind == "ours-before":  # this package before the small-shuffle changes: one task per input
            from smallpond.logical import node  # partition, snappy shuffle files
            node.SMALL_SHUFFLE_TASK_BYTES = 1
            extra["shuffle_compression"] = "snappy"
        sp = smallpond.init(job_id="tpch", data_root=os.path.join(work, "root"), num_executors=2, progress=False,
                            report_format="none", **extra)
        sp.from_items([0, 1]).repartition(2, by_rows=True).map("item").count()  # start the workers
    else:
        sp = smallpond.init(data_root=os.path.join(work, "root"), num_executors=0)
    t_init = time.perf_counter() - t0
    t_q1, t_q18 = [], []
    for _ in range(repeat):
        if kind != "original":  # forget finished tasks: every repetition computes everything again
            _sh.rmtree(os.path.join(sp.job_dir, "tasks"), ignore_errors=True)
        t0 = time.perf_counter()
        df = sp.read_parquet(files).repartition(len(files))
        q1 = sp.partial_sql(Q1_FINAL, sp.partial_sql(Q1_PARTIAL, df).repartition(1)).to_pandas()
        t_q1.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        # two-phase: partial sums per input partition, shuffle them by key, final sums + having
        keys = sp.partial_sql(Q18_PARTIAL, df).repartition(nparts, hash_by="l_orderkey")
        q18 = sp.partial_sql(Q18_FINAL, keys).to_pandas()
        t_q18.append(time.perf_counter() - t0)
    try:
        sp.shutdown()
    except Exception:
        pass
    return t_init, t_q1, t_q18, _q1_rows(q1), [len(q18), float(q18.qty.sum())]


def run_duckdb(files, repeat=1):
    import duckdb
    con = duckdb.connect(config={"threads": 2})
    src = "read_parquet([" + ", ".join(f"'{f}'" for f in files) + "])"
    t_q1, t_q18 = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        q1 = con.sql(Q1_SINGLE.format(src)).df()
        t_q1.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        n, s = con.sql(f"select count(*), sum(qty) from ({Q18.format(src)})").fetchall()[0]
        t_q18.append(time.perf_counter() - t0)
    return 0.0, t_q1, t_q18, _q1_rows(q1), [int(n), float(s)]


def run_polars(files, repeat=1):
    import datetime as dt
    import polars as pl
    lf = pl.scan_parquet(files)
    t_q1, t_q18 = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        disc = pl.col("l_extendedprice") * (1 - pl.col("l_discount"))
        q1 = (lf.filter(pl.col("l_shipdate") <= dt.date(1998, 9, 2))
              .group_by(["l_returnflag", "l_linestatus"])
              .agg(pl.col("l_quantity").sum().alias("sum_qty"), pl.col("l_extendedprice").sum().alias("sum_base_price"),
                   disc.sum().alias("sum_disc_price"), (disc * (1 + pl.col("l_tax"))).sum().alias("sum_charge"),
                   pl.col("l_quantity").mean().alias("avg_qty"), pl.col("l_extendedprice").mean().alias("avg_price"),
                   pl.col("l_discount").mean().alias("avg_disc"), pl.len().alias("count_order"))
              .sort(["l_returnflag", "l_linestatus"]).collect())
        t_q1.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        q18 = (lf.group_by("l_orderkey").agg(pl.col("l_quantity").sum().alias("qty"))
               .filter(pl.col("qty") > 250).collect())
        t_q18.append(time.perf_counter() - t0)
    return 0.0, t_q1, t_q18, _q1_rows(q1.to_pandas()), [q18.height, float(q18["qty"].sum())]


def worker(args) -> None:
    import statistics
    files = json.loads(args.files)
    if args.system in ("ours", "ours-before", "original"):
        # the original runs once: its Ray session start and per-run costs dwarf the spread
        r = run_smallpond(files, args.partitions, args.work, args.system, args.repeat if args.system != "original" else 1)
    elif args.system == "duckdb":
        r = run_duckdb(files, args.repeat)
    else:
        r = run_polars(files, args.repeat)
    t_init, q1_runs, q18_runs, q1, q18 = r
    emit({"init_s": t_init, "q1_s": statistics.median(q1_runs), "q18_s": statistics.median(q18_runs),
          "q1_runs": q1_runs, "q18_runs": q18_runs, "q1": q1, "q18": q18})


def same_answer(a: dict, b: dict) -> bool:
    import math
    if a["q18"][0] != b["q18"][0] or not math.isclose(a["q18"][1], b["q18"][1], rel_tol=1e-9):
        return False
    if len(a["q1"]) != len(b["q1"]):
        return False
    for ra, rb in zip(a["q1"], b["q1"]):
        for x, y in zip(ra, rb):
            if isinstance(x, str) and x != y:
                return False
            if not isinstance(x, str) and not math.isclose(x, y, rel_tol=1e-9):
                return False
    return True


# -- orchestrator ------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--input-files", type=int, default=8)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--systems", nargs="+", default=["ours", "original", "duckdb", "polars"])
    ap.add_argument("--orig-python", default=ORIG_PYTHON)
    ap.add_argument("--timeout", type=int, default=1200)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each query this many times per system (ours, DuckDB, Polars) and report the median")
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--files", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.system:
        return worker(args)
    work = tempfile.mkdtemp(prefix="sp-tpch-", dir=args.workdir)
    results = []
    try:
        t0 = time.time()
        files, rows = generate(os.path.join(work, "input"), args.sf, args.input_files)
        size = sum(os.path.getsize(f) for f in files)
        os.sync()  # write the generated files back now, not while the first system runs
        print(f"generated lineitem SF {args.sf:g}: {rows:,} rows, {size / 1e6:.0f} MB parquet in {len(files)} files, "
              f"{time.time() - t0:.1f}s", flush=True)
        for system in args.systems:
            python = args.orig_python if system == "original" else sys.executable
            if system == "original" and not os.path.exists(python):
                results.append({"system": system, "error": f"{python} not found"})
                continue
            swork = os.path.join(work, f"work-{system}")
            env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"} if system == "original" else {}
            r = run_worker(python, os.path.abspath(__file__), ["--system", system, "--files", json.dumps(files),
                           "--work", swork, "--partitions", str(args.partitions), "--repeat", str(args.repeat)], args.timeout, env)
            r["system"] = system
            print({k: v for k, v in r.items() if k not in ("q1", "q1_runs")}, flush=True)
            results.append(r)
            shutil.rmtree(swork, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ref = next((r for r in results if r["system"] == "duckdb" and "error" not in r), None)
    ours = next((r for r in results if r["system"] == "ours" and "error" not in r), None)
    for r in results:
        if "error" in r:
            continue
        r["check"] = "ok" if ref is None or same_answer(r, ref) else "DIFFERS FROM DUCKDB"
        r["mrows_per_s_q1"] = rows / r["q1_s"] / 1e6
        if ours:
            r["q1_vs_ours"] = r["q1_s"] / ours["q1_s"]
            r["q18_vs_ours"] = r["q18_s"] / ours["q18_s"]
    print_table(f"TPC-H-style lineitem SF {args.sf:g} ({rows:,} rows), {args.partitions} hash partitions for Q18; "
                f"{machine()}", results, [
        ("system", lambda r: r["system"], 10),
        ("Q1 s", lambda r: f"{r['q1_s']:.2f}" if "q1_s" in r else "-", 8),
        ("Q1 Mrows/s", lambda r: f"{r['mrows_per_s_q1']:.1f}" if "q1_s" in r else "-", 12),
        ("Q1 their/ours", lambda r: f"{r['q1_vs_ours']:.2f}x" if "q1_vs_ours" in r else "-", 15),
        ("Q18 s", lambda r: f"{r['q18_s']:.3f}" if "q18_s" in r else "-", 8),
        ("Q18 min-max", lambda r: f"{min(r['q18_runs']):.3f}-{max(r['q18_runs']):.3f}" if "q18_runs" in r else "-", 14),
        ("Q18 their/ours", lambda r: f"{r['q18_vs_ours']:.2f}x" if "q18_vs_ours" in r else "-", 16),
        ("init s", lambda r: f"{r['init_s']:.2f}" if "init_s" in r else "-", 8),
        ("check", lambda r: r.get("check", r.get("error", ""))[:50], 52)])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "tpch", "sf": args.sf, "rows": rows, "repeat": args.repeat, "machine": machine(), "commit": git_commit(),
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
