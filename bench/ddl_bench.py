"""DDL bench: what each schema change costs on a table of N rows (issue 27), against an UPDATE of every row.

An embedded Postgres gets a ``bench`` table of N rows; capture and one load build an SCD1 and an
SCD2 table of it (not timed). Then, one after another on the same table:

* reference: ``UPDATE bench SET rev = rev + 1`` (every row changes once, streamed);
* each DDL of ``--ddl`` (default: the matrix's kinds), with nothing else changing.

For each: the wall time of ``headwater capture --until-caught-up`` (the stream, and the re-read a
DDL queues), the bytes it appended to the log (file backend, zstd batches), the wall time of
``headwater load --available-now`` (both tables; a rename or widening rewrites them first) and
the bytes of Delta files it added under both tables. Writes a table to stdout; paste it with the
command and the load average into ``bench/RESULTS.md``.

    .venv/bin/python bench/ddl_bench.py [--rows 1000000] [--ddl add_default,rename]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operations.embedded_postgres import EmbeddedPostgres

TABLE = """
CREATE TABLE bench (
    id int PRIMARY KEY, qty int, price numeric(8,2), name varchar(10), ratio real, note text, rev int NOT NULL
);
INSERT INTO bench
SELECT i, i % 1000, (i % 100000) / 100.0, 'n' || (i % 100000), i / 7.0, 'note ' || i, 0
FROM generate_series(1, %(rows)s) AS i;
CREATE PUBLICATION headwater_bench FOR TABLE bench;
"""

#: The statement of each measured kind (on the same table, in this order).
DDLS = {
    "update_all (reference)": "UPDATE bench SET rev = rev + 1",
    "add_nullable": "ALTER TABLE bench ADD COLUMN tag1 text",
    "add_default": "ALTER TABLE bench ADD COLUMN tag2 text DEFAULT 'x'",
    "add_volatile": "ALTER TABLE bench ADD COLUMN tag3 float8 DEFAULT random()",
    "drop_column": "ALTER TABLE bench DROP COLUMN tag1",
    "rename_column": "ALTER TABLE bench RENAME COLUMN note TO remark",
    "widen_varchar": "ALTER TABLE bench ALTER COLUMN name TYPE varchar(20)",
    "widen_int": "ALTER TABLE bench ALTER COLUMN qty TYPE bigint",
    "widen_numeric": "ALTER TABLE bench ALTER COLUMN price TYPE numeric(14,4)",
    "widen_real": "ALTER TABLE bench ALTER COLUMN ratio TYPE double precision",
    "alter_using": "ALTER TABLE bench ALTER COLUMN remark TYPE text USING upper(remark)",
    "set_not_null": "ALTER TABLE bench ALTER COLUMN rev SET DEFAULT 0, ALTER COLUMN qty SET NOT NULL",
}


def tree_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (0 when it does not exist)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--ddl", default=",".join(DDLS), help="comma-separated kinds to run, in this order")
    args = parser.parse_args()
    wanted = [name for name in DDLS if name in args.ddl.split(",") or name.startswith("update_all")]
    with tempfile.TemporaryDirectory(prefix="hw-ddl-bench-") as work:
        root = Path(work)
        server = EmbeddedPostgres(
            root / "pg", settings={"max_wal_senders": "10", "fsync": "off", "max_wal_size": "4GB"}
        )
        server.start()
        try:
            dsn = server.create_database("bench")
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(TABLE.replace("%(rows)s", str(args.rows)))
            home = root / "home"
            config = root / "headwater.yaml"
            tables = {f"bench_{m}": {"from": "bench.public.bench", "mode": m} for m in ("scd1", "scd2")}
            config.write_text(
                yaml.safe_dump(
                    {
                        "project": "ddl_bench",
                        "home": str(home),
                        "log": {"partitions": 3, "file": {"fsync": "never"}},
                        "sources": {"bench": {"dsn": dsn, "tables": ["public.bench"], "heartbeat_interval_s": 1}},
                        "warehouse": {"tables": tables},
                    }
                )
            )

            def cli(*command: str) -> float:
                started = time.perf_counter()
                result = subprocess.run(
                    [sys.executable, "-m", "headwater", "--config", str(config), *command],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if result.returncode != 0:
                    raise SystemExit(f"headwater {' '.join(command)} failed: {result.stderr[-2000:]}")
                return time.perf_counter() - started

            cli("capture", "--until-caught-up")
            cli("load", "--available-now")
            log_dir, warehouse = home / "log", home / "warehouse"
            print(f"ddl_bench rows={args.rows:,} load average {os.getloadavg()[0]:.1f}")
            print("| change | capture s | log bytes | load s | Delta bytes added |")
            print("| --- | --- | --- | --- | --- |")
            for name in wanted:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(DDLS[name])
                log_before, delta_before = tree_bytes(log_dir), tree_bytes(warehouse)
                captured = cli("capture", "--until-caught-up")
                log_added = tree_bytes(log_dir) - log_before
                loaded = cli("load", "--available-now")
                delta_added = tree_bytes(warehouse) - delta_before
                print(f"| {name} | {captured:.1f} | {log_added:,} | {loaded:.1f} | {delta_added:,} |", flush=True)
            print(f"load average at the end {os.getloadavg()[0]:.1f}")
        finally:
            server.stop("fast")


if __name__ == "__main__":
    main()
