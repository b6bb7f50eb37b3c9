"""Verify bench: ``headwater verify`` on an SCD1 table of N rows against ``COPY`` of its source table, same run.

An embedded Postgres gets a ``customers`` table of N rows (8 columns of common types);
capture and one Spark load build the warehouse table (not timed). Then, best of
``--repeat`` each:

* reference: ``COPY customers TO STDOUT`` read whole by psycopg (one full scan, every value sent);
* ``verify equal``: :func:`operations.verify.verify_table` on the unchanged table (snapshot,
  level-1 hashes on both sides);
* ``verify 10 differ``: after 10 rows are rewritten straight into the Delta table (level 2
  reads the differing buckets again on both sides).

The issue's budget: verify costs at most about twice a full scan of the source table.

    .venv/bin/python bench/verify_bench.py [--rows 300000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.config import load_config
from operations.embedded_postgres import EmbeddedPostgres

TABLE = """
CREATE TABLE customers (
    id bigint PRIMARY KEY, email text, name text, country text, balance numeric(12,2),
    created timestamptz, score float8, active boolean
);
INSERT INTO customers
SELECT i, 'user' || i || '@example.com', 'Customer number ' || i, (ARRAY['NZ','PT','DE','US','JP'])[1 + i % 5],
       (i % 100000) / 100.0, timestamptz '2026-01-01 00:00:00+00' + i * interval '1 second', i / 7.0, i % 3 = 0
FROM generate_series(1, %(rows)s) AS i;
CREATE PUBLICATION headwater_bench FOR TABLE customers;
"""


def best(label: str, repeat: int, run: object) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="print a profile of one verify first")
    args = parser.parse_args()

    from deltalake import DeltaTable

    from capture.runner import run_capture
    from operations.verify import verify_table
    from spark_log.job import spark_job
    from warehouse_loader.load_job import run_loads, table_path

    with tempfile.TemporaryDirectory(prefix="verify-bench-") as tmp:
        work = Path(tmp)
        server = EmbeddedPostgres(work / "pg", settings={"max_wal_senders": "10", "fsync": "off"})
        server.start()
        try:
            dsn = server.create_database("bench")
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(TABLE.replace("%(rows)s", str(args.rows)))
                conn.execute("VACUUM ANALYZE customers")
            document = {
                "project": "bench",
                "home": str(work / "home"),
                "log": {"partitions": 3, "file": {"fsync": "never"}},
                "sources": {"bench": {"dsn": dsn, "tables": ["public.customers"]}},
                "warehouse": {"tables": {"cur": {"from": "bench.public.customers"}}},
            }
            (work / "headwater.yaml").write_text(yaml.safe_dump(document))
            config = load_config(work / "headwater.yaml")
            setup = time.perf_counter()
            run_capture(config, (), until_caught_up=True)
            with spark_job(config, "verify-bench") as (spark, log):
                run_loads(spark, config, log, (), available_now=True)
            print(f"setup (capture + Spark load of {args.rows:,} rows, not timed): {time.perf_counter() - setup:.1f}s")

            def copy() -> None:
                with (
                    psycopg.connect(dsn) as conn,
                    conn.cursor() as cur,
                    cur.copy("COPY customers TO STDOUT") as stream,
                ):
                    for _ in stream:
                        pass

            results: list[object] = []

            def verify() -> None:
                results.append(verify_table(config, "cur", record=False))

            if args.profile:
                import cProfile
                import pstats

                cProfile.runctx("verify()", globals(), locals(), str(work / "prof"))
                pstats.Stats(str(work / "prof")).sort_stats("cumulative").print_stats(25)
            reference = best("copy", args.repeat, copy)
            equal = best("verify", args.repeat, verify)
            last = results[-1]
            assert last.equal, last.lines()  # type: ignore[attr-defined]
            DeltaTable(str(table_path(config, "cur"))).update(
                updates={"name": "'tampered'"}, predicate=f'"id" % {max(1, args.rows // 10)} = 0'
            )
            results.clear()
            differ = best("verify-differ", args.repeat, verify)
            found = results[-1]
            keys = len(found.differences)  # type: ignore[attr-defined]
            print(f"verify_bench rows={args.rows:,}: COPY customers TO STDOUT {reference:.3f}s (reference)")
            timings = last.timings  # type: ignore[attr-defined]
            print(
                f"verify_bench rows={args.rows:,}: verify equal {equal:.3f}s = {equal / reference:.2f}x COPY "
                f"({last.buckets:,} buckets; of the last run: source hash scan {timings['source']:.3f}s = "  # type: ignore[attr-defined]
                f"{timings['source'] / reference:.2f}x COPY, warehouse hash scan {timings['warehouse']:.3f}s)"
            )
            print(
                f"verify_bench rows={args.rows:,}: verify {keys} keys differ {differ:.3f}s = {differ / reference:.2f}x "
                f"COPY ({found.differing_buckets} buckets read again)"  # type: ignore[attr-defined]
            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
