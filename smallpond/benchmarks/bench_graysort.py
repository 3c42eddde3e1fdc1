"""GraySort-style sort: 100-byte records (10-byte random key + 90-byte payload), generated on the
fly, range-partitioned on the key prefix into N partitions, each sorted, written as Parquet:
the output files, ordered by their first key, are globally sorted.

Systems, each in its own process on the same input files:
  ours      this smallpond: read -> partial_sql(partition id) -> repartition(N, by=pid) -> partial_sql(order by key) -> write_parquet
  original  smallpond 0.15.0 running the same DataFrame code (its own venv, local Ray, num_executors=0)
  duckdb    one DuckDB process: COPY (select * from read_parquet(...) order by key) TO ...
  polars    one Polars process: scan_parquet(...).sort("key").sink_parquet(...)

usage: python bench_graysort.py [--size-gb 1] [--partitions 16] [--json out.json]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ORIG_PYTHON, emit, git_commit, machine, print_table, run_worker  # noqa: E402

RECORD, KEY = 100, 10


# -- data --------------------------------------------------------------------------------------
def generate(folder: str, size_gb: float, nfiles: int, seed: int = 42):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(folder, exist_ok=True)
    total = int(size_gb * 1e9) // RECORD
    rng = np.random.default_rng(seed)
    files, hi_sum = [], 0
    for i in range(nfiles):
        n = total // nfiles if i < nfiles - 1 else total - (total // nfiles) * (nfiles - 1)
        keys = np.frombuffer(rng.bytes(n * KEY), np.uint8)
        payload = np.frombuffer(rng.bytes(n * (RECORD - KEY)), np.uint8)
        hi_sum += int(_hi_lo(keys.reshape(n, KEY))[0].sum(dtype=np.uint64))
        t = pa.table({"key": _binary(keys, n, KEY), "payload": _binary(payload, n, RECORD - KEY)})
        files.append(os.path.join(folder, f"input-{i:03d}.parquet"))
        pq.write_table(t, files[-1], compression="none", use_dictionary=False)
    return files, total, hi_sum % (1 << 64)


def _binary(flat, n: int, width: int):
    import numpy as np
    import pyarrow as pa
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * width).tobytes())
    return pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(flat.tobytes())])


def _hi_lo(k):
    import numpy as np
    hi = k[:, :8].copy().view(">u8").ravel().astype(np.uint64)
    lo = k[:, 8:10].copy().view(">u2").ravel().astype(np.uint64)
    return hi, lo


def verify(out_dir: str, rows: int, hi_sum: int) -> str:
    """Every file sorted, files range-disjoint (global order), row count and key checksum kept."""
    import numpy as np
    import pyarrow.parquet as pq
    files = sorted(glob.glob(os.path.join(out_dir, "**", "*.parquet"), recursive=True))
    spans, count, total = [], 0, 0
    for f in files:
        col = pq.read_table(f, columns=["key"]).column("key").combine_chunks()
        if len(col) == 0:
            continue
        k = np.frombuffer(col.buffers()[2], np.uint8, len(col) * KEY, col.offset * KEY).reshape(-1, KEY)
        hi, lo = _hi_lo(k)
        ok = np.all((hi[1:] > hi[:-1]) | ((hi[1:] == hi[:-1]) & (lo[1:] >= lo[:-1])))
        if not ok:
            return f"NOT SORTED: {os.path.basename(f)}"
        spans.append(((int(hi[0]), int(lo[0])), (int(hi[-1]), int(lo[-1]))))
        count += len(col)
        total = (total + int(hi.sum(dtype=np.uint64))) % (1 << 64)
    spans.sort()
    if any(spans[i][1] > spans[i + 1][0] for i in range(len(spans) - 1)):
        return "FILES OVERLAP"
    if count != rows:
        return f"ROWS {count} != {rows}"
    if total != hi_sum:
        return "KEY CHECKSUM MISMATCH"
    return "ok"


# -- systems (worker mode) ---------------------------------------------------------------------
def run_smallpond(files, out, nparts, work, kind):
    import smallpond
    t0 = time.perf_counter()
    if kind == "ours":
        sp = smallpond.init(job_id="graysort", data_root=os.path.join(work, "root"), num_executors=2,
                            progress=False, report_format="none")
        sp.from_items([0, 1]).repartition(2, by_rows=True).map("item").count()  # start the workers
    else:
        sp = smallpond.init(data_root=os.path.join(work, "root"), num_executors=0)  # job_id must be a UUID there
    t_init = time.perf_counter() - t0
    t0 = time.perf_counter()
    df = sp.read_parquet(files)
    df = df.repartition(len(files))
    df = sp.partial_sql(f"select key, payload, ('0x' || substring(hex(key), 1, 4))::INTEGER * {nparts} // 65536 "
                        f"as pid from {{0}}", df)
    df = df.repartition(nparts, by="pid")
    df = sp.partial_sql("select key, payload from {0} order by key", df)
    df.write_parquet(out)
    t_job = time.perf_counter() - t0
    try:
        sp.shutdown()
    except Exception:
        pass
    return t_init, t_job


def run_duckdb(files, out, memory_limit=None):
    import duckdb
    os.makedirs(out, exist_ok=True)
    t0 = time.perf_counter()
    config = {"threads": 2}
    if memory_limit:
        config["memory_limit"] = memory_limit
    con = duckdb.connect(config=config)
    lst = "[" + ", ".join(f"'{f}'" for f in files) + "]"
    con.execute(f"copy (select key, payload from read_parquet({lst}) order by key) to '{out}/sorted.parquet' (format parquet)")
    return 0.0, time.perf_counter() - t0


def run_polars(files, out):
    import polars as pl
    os.makedirs(out, exist_ok=True)
    t0 = time.perf_counter()
    pl.scan_parquet(files).sort("key").sink_parquet(f"{out}/sorted.parquet", engine="streaming")
    return 0.0, time.perf_counter() - t0


def worker(args) -> None:
    files = json.loads(args.files)
    if args.system in ("ours", "original"):
        t_init, t_job = run_smallpond(files, args.out, args.partitions, args.work, args.system)
    elif args.system == "duckdb":
        t_init, t_job = run_duckdb(files, args.out, args.duckdb_memory)
    else:
        t_init, t_job = run_polars(files, args.out)
    emit({"init_s": t_init, "job_s": t_job})


# -- orchestrator ------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--input-files", type=int, default=8)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--systems", nargs="+", default=["ours", "original", "duckdb", "polars"])
    ap.add_argument("--orig-python", default=ORIG_PYTHON)
    ap.add_argument("--timeout", type=int, default=1200)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--duckdb-memory", default=None, help="memory_limit of the single-process DuckDB peer, e.g. 8GB")
    ap.add_argument("--mem-limit-gb", type=float, default=None,
                    help="kill a system whose process tree holds more resident memory than this (recorded as an error)")
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--files", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.system:
        return worker(args)
    work = tempfile.mkdtemp(prefix="sp-graysort-", dir=args.workdir)
    results = []
    try:
        t0 = time.time()
        files, rows, hi_sum = generate(os.path.join(work, "input"), args.size_gb, args.input_files)
        os.sync()  # write the generated files back now, not while the first system runs
        print(f"generated {rows:,} records ({rows * RECORD / 1e9:.2f} GB) in {len(files)} files, {time.time() - t0:.1f}s",
              flush=True)
        for system in args.systems:
            python = args.orig_python if system == "original" else sys.executable
            if system == "original" and not os.path.exists(python):
                results.append({"system": system, "error": f"{python} not found"})
                continue
            out, swork = os.path.join(work, f"out-{system}"), os.path.join(work, f"work-{system}")
            env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"} if system == "original" else {}  # Ray on 127.0.0.1
            r = run_worker(python, os.path.abspath(__file__),
                           ["--system", system, "--files", json.dumps(files), "--out", out, "--work", swork,
                            "--partitions", str(args.partitions)]
                           + (["--duckdb-memory", args.duckdb_memory] if args.duckdb_memory else []), args.timeout, env,
                           mem_limit_gb=args.mem_limit_gb)
            r["system"] = system
            if "error" not in r:
                r["check"] = verify(out, rows, hi_sum)
                r["gb_per_min"] = rows * RECORD / 1e9 / (r["job_s"] / 60)
            print(r, flush=True)
            results.append(r)
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(swork, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ours = next((r for r in results if r["system"] == "ours" and "error" not in r), None)
    for r in results:
        if ours and "error" not in r:
            r["ours_speedup"] = r["job_s"] / ours["job_s"]
    print_table(f"GraySort-style sort, {args.size_gb:g} GB ({rows:,} x 100-byte records), {args.partitions} partitions; "
                f"{machine()}", results, [
        ("system", lambda r: r["system"], 10),
        ("job s", lambda r: f"{r['job_s']:.2f}" if "job_s" in r else "-", 9),
        ("GB/min", lambda r: f"{r['gb_per_min']:.2f}" if "gb_per_min" in r else "-", 9),
        ("init s", lambda r: f"{r['init_s']:.2f}" if "init_s" in r else "-", 9),
        ("peak GB", lambda r: f"{r['peak_rss_gb']:.1f}" if "peak_rss_gb" in r else "-", 9),
        ("their/ours", lambda r: f"{r['ours_speedup']:.2f}x" if "ours_speedup" in r else "-", 12),
        ("check", lambda r: r.get("check", r.get("error", ""))[:60], 64)])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "graysort", "size_gb": args.size_gb, "partitions": args.partitions,
                       "mem_limit_gb": args.mem_limit_gb, "machine": machine(), "commit": git_commit(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
