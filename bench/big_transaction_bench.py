"""One huge source transaction: peak RSS of ``headwater capture --until-caught-up`` against its size.

Starts its own PostgreSQL (embedded, UTC), creates ``big`` (``id bigint`` key, an int, a
~40-byte label, a timestamp) with N rows, and for each N in ``--changes`` captures ONE
``UPDATE big SET n = n + 1`` over every row, as a migration or backfill does.

Each variant is a real ``headwater capture --until-caught-up`` process with its own source,
slot (created before the UPDATE, ``snapshot: never``) and file log; the variants decode the
same WAL one after another. Its RSS is sampled from ``/proc/<pid>/status`` every 20 ms
(``VmRSS``) and its peak read from ``wait4``'s ``ru_maxrss``; the log must then hold exactly N
update events, one BEGIN and one END record (``transactions: true``) whose END counts N.

* ``current``: this tree.
* ``reference``: ``--reference-tree DIR``, another checkout of Headwater (e.g. the commit
  before a change: ``git archive <commit> | tar -x -C DIR`` plus its native extension),
  run by the same interpreter on the same WAL in the same run.

    .venv/bin/python bench/big_transaction_bench.py [--changes 200000,2000000] [--reference-tree DIR]
        [--spill-threshold-bytes N] [--keep DIR]

Each line: ``<variant> <N> changes: peak RSS <MiB> (sampled <MiB>), <s> wall, <s> CPU, spill <MiB> on disk at most``.

``--kind mysql``: the same UPDATE on an embedded MariaDB (``make prereqs``), captured by a MySQL
source per variant (``snapshot: never``, ``transactions: true``; the reference's
``max_transaction_bytes`` raised out of the way, for a tree from before MySQL capture spilled),
each variant reading the same binlog. The line adds the peak RSS above the process at rest per
binlog byte of the transaction.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import orjson
from harness.rss import TreeRss

from log.file.backend import FileLog

ROOT = Path(__file__).resolve().parent.parent
PUBLICATION = "headwater_bigtxn"
TABLE_TOPIC = "public.big"


def start_server() -> tuple[Any, Any]:
    """An embedded server in UTC with room for a long transaction's WAL."""
    from harness.postgres import start_pg_server

    return start_pg_server(timezone="UTC", settings={"max_wal_size": "8GB", "checkpoint_timeout": "30min"})


def write_config(home: Path, source: str, dsn: str, *, spill_threshold: int | None) -> Path:
    """A ``headwater.yaml`` (JSON is YAML) with one source on ``public.big``."""
    settings: dict[str, Any] = {
        "dsn": dsn,
        "tables": ["public.big"],
        "snapshot": "never",
        "publication": PUBLICATION,
        "transactions": True,
        "heartbeat_interval_s": 5,
    }
    document: dict[str, Any] = {"project": "bigtxn", "home": str(home), "sources": {source: settings}}
    if spill_threshold is not None:
        settings["spill_threshold_bytes"] = spill_threshold
    config = home.parent / f"{source}.yaml"
    config.write_text(orjson.dumps(document).decode())
    return config


def disk_use(directory: Path) -> int:
    """Bytes of the regular files under ``directory``."""
    total = 0
    for path in directory.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except OSError:
            continue
    return total


def capture(config: Path, tree: Path, spill_dir: Path) -> dict[str, float]:
    """Run ``capture --until-caught-up`` from ``tree``; its peak RSS, sampled RSS, wall and CPU, spill high-water."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "headwater", "--config", str(config), "capture", "--until-caught-up"]
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sampler = TreeRss(process.pid, every_s=0.02)
    spill_peak = 0
    stop = threading.Event()

    def watch_spill() -> None:
        nonlocal spill_peak
        while not stop.wait(0.5):
            if spill_dir.exists():
                spill_peak = max(spill_peak, disk_use(spill_dir))

    watcher = threading.Thread(target=watch_spill, daemon=True)
    watcher.start()
    assert process.stdout is not None and process.stderr is not None
    chunks: dict[str, list[bytes]] = {"out": [], "err": []}
    pipe_threads = [
        threading.Thread(target=lambda s=stream, k=key: chunks[k].extend(iter(lambda: s.read(65536), b"")), daemon=True)
        for key, stream in (("out", process.stdout), ("err", process.stderr))
    ]
    for thread in pipe_threads:
        thread.start()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    for thread in pipe_threads:
        thread.join(timeout=5)
    stop.set()
    watcher.join(timeout=5)
    sampler.join()
    err = b"".join(chunks["err"])
    if process.returncode != 0:
        msg = f"capture exited {process.returncode}: {err.decode(errors='replace')[-2000:]}"
        raise SystemExit(msg)
    return {
        "peak_mib": usage.ru_maxrss / 1024,
        "sampled_mib": sampler.peak_kib / 1024,
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "spill_mib": spill_peak / 2**20,
    }


def topic_events(log: FileLog, topic: str) -> int:
    """Records in every partition of ``topic`` (end offsets: nothing is compacted here)."""
    return sum(log.end_offset(topic, p) for p in range(log.describe_topic(topic).partitions))


def check_log(home: Path, source: str, changes: int) -> str:
    """The log holds ``changes`` events in ``<source>.public.big`` and one BEGIN/END pair counting them."""
    with FileLog(home / "log") as log:
        events = topic_events(log, f"{source}.{TABLE_TOPIC}")
        boundaries = f"{source}.transaction"
        records = []
        for partition in range(log.describe_topic(boundaries).partitions):
            records.extend(log.read(boundaries, partition, 0, max_records=10))
    statuses = sorted(orjson.loads(r.value)["status"] for r in records if r.value is not None)
    ends = [orjson.loads(r.value)["event_count"] for r in records if r.value and b'"END"' in r.value]
    ok = events == changes and statuses == ["BEGIN", "END"] and ends == [changes]
    if not ok:
        msg = f"{source}: the log holds {events} events and {statuses} {ends}, expected {changes} and one BEGIN/END"
        raise SystemExit(msg)
    return "log ok"


def run_size(server: Any, changes: int, variants: dict[str, Path], work: Path, spill_threshold: int | None) -> None:
    database = f"big{changes}"
    server.create_database(database)
    dsn = server.dsn(database)
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, n int, label text, at timestamptz)")
        conn.execute(
            "INSERT INTO big SELECT g, g %% 1000, 'a label of about forty bytes, row ' || g, now() "
            "FROM generate_series(1, %s::bigint) g",
            (changes,),
        )
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE big")
    homes: dict[str, Path] = {}
    for variant, tree in variants.items():
        home = work / f"{variant}{changes}" / "home"
        home.mkdir(parents=True)
        homes[variant] = home
        source = f"{variant}{changes}"
        config = write_config(home, source, dsn, spill_threshold=spill_threshold if variant == "current" else None)
        capture(config, tree, home / "capture")  # creates the slot: nothing to capture yet
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE big SET n = n + 1")
    print(f"UPDATE of {changes:,} rows in one transaction: {time.perf_counter() - started:.1f} s", flush=True)
    for variant, tree in variants.items():
        source = f"{variant}{changes}"
        home = homes[variant]
        result = capture(home.parent / f"{source}.yaml", tree, home / "capture")
        print(
            f"{variant} {changes:,} changes: peak RSS {result['peak_mib']:.0f} MiB "
            f"(sampled {result['sampled_mib']:.0f} MiB), {result['wall_s']:.1f} s wall, {result['cpu_s']:.1f} s CPU, "
            f"spill {result['spill_mib']:.0f} MiB on disk at most; {check_log(home, source, changes)}; "
            f"load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        shutil.rmtree(home.parent, ignore_errors=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    server.drop_database(database)


def mysql_config(home: Path, source: str, dsn: str, table: str, *, spill_threshold: int | None, old: bool) -> Path:
    """A ``headwater.yaml`` with one MySQL source on ``table`` (``old``: a tree without spilling, its bound raised)."""
    settings: dict[str, Any] = {
        "kind": "mysql",
        "dsn": dsn,
        "tables": [table],
        "snapshot": "never",
        "transactions": True,
    }
    if old:
        settings["max_transaction_bytes"] = 1 << 40
    elif spill_threshold is not None:
        settings["spill_threshold_bytes"] = spill_threshold
    document = {"project": "bigtxn", "home": str(home), "sources": {source: settings}}
    config = home.parent / f"{source}.yaml"
    config.write_text(orjson.dumps(document).decode())
    return config


def binlog_end(cursor: Any) -> tuple[str, int]:
    cursor.execute("SHOW MASTER STATUS")
    file, offset = cursor.fetchone()[:2]
    return str(file), int(offset)


def run_mysql(changes_list: list[int], variants: dict[str, Path], work: Path, spill_threshold: int | None) -> None:
    """Each N: one UPDATE of N rows on MariaDB captured by each variant's ``headwater capture``; RSS per binlog byte."""
    import pymysql
    from harness.mariadb import start_mariadb_server

    server, stop = start_mariadb_server(timezone="UTC", settings={"max_binlog_size": "1073741824"})
    try:
        for changes in changes_list:
            database = f"big{changes}"
            with pymysql.connect(**server.connect_args(), autocommit=True) as conn, conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE {database}")
                cur.execute(f"CREATE TABLE {database}.big (id bigint PRIMARY KEY, n int, label text, at datetime(6))")
                cur.execute(
                    f"INSERT INTO {database}.big SELECT seq, seq % 1000, "
                    f"CONCAT('a label of about forty bytes, row ', seq), NOW(6) FROM {database}.seq_1_to_{changes}"
                )
            configs: dict[str, tuple[Path, Path, float]] = {}
            for variant, tree in variants.items():
                home = work / f"mysql{variant}{changes}" / "home"
                home.mkdir(parents=True)
                source = f"{variant}{changes}"
                config = mysql_config(
                    home,
                    source,
                    server.dsn(database),
                    f"{database}.big",
                    spill_threshold=spill_threshold,
                    old=variant == "reference",
                )
                rest = capture(config, tree, home / "capture" / source / "spill")  # saves the binlog position
                configs[variant] = (config, home, rest["peak_mib"])
            with pymysql.connect(**server.connect_args(), autocommit=True) as conn, conn.cursor() as cur:
                before = binlog_end(cur)
                started = time.perf_counter()
                cur.execute(f"UPDATE {database}.big SET n = n + 1")
                update_s = time.perf_counter() - started
                after = binlog_end(cur)
            if before[0] != after[0]:
                msg = f"the binlog rotated during the UPDATE ({before} -> {after}): raise max_binlog_size"
                raise SystemExit(msg)
            binlog_bytes = after[1] - before[1]
            size = f"{binlog_bytes / 2**20:.1f} MiB of binlog"
            print(f"UPDATE of {changes:,} rows in one transaction: {update_s:.1f} s, {size}", flush=True)
            for variant, tree in variants.items():
                config, home, rest_mib = configs[variant]
                source = f"{variant}{changes}"
                result = capture(config, tree, home / "capture" / source / "spill")
                with FileLog(home / "log") as log:
                    events = topic_events(log, f"{source}.{database}.big")
                if events != changes:
                    msg = f"{source}: the log holds {events} events, expected {changes}"
                    raise SystemExit(msg)
                above_rest = (result["peak_mib"] - rest_mib) * 2**20
                print(
                    f"mysql {variant} {changes:,} changes: peak RSS {result['peak_mib']:.0f} MiB "
                    f"(sampled {result['sampled_mib']:.0f} MiB, {rest_mib:.0f} MiB at rest), {result['wall_s']:.1f} s "
                    f"wall, {result['cpu_s']:.1f} s CPU, spill {result['spill_mib']:.0f} MiB on disk at most; "
                    f"{above_rest / binlog_bytes:.1f} bytes of RSS per binlog byte; log ok; "
                    f"load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
                shutil.rmtree(home.parent, ignore_errors=True)
            with pymysql.connect(**server.connect_args(), autocommit=True) as conn, conn.cursor() as cur:
                cur.execute(f"DROP DATABASE {database}")
    finally:
        stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", default="200000,2000000", help="comma-separated transaction sizes")
    parser.add_argument("--reference-tree", type=Path, help="another Headwater checkout, run as 'reference'")
    parser.add_argument("--spill-threshold-bytes", type=int, help="sources.<name>.spill_threshold_bytes (current)")
    parser.add_argument("--only", choices=("current", "reference"), help="run one variant only")
    parser.add_argument("--keep", type=Path, help="work directory (default: a temporary one, removed)")
    parser.add_argument("--kind", choices=("postgres", "mysql"), default="postgres", help="the source kind")
    args = parser.parse_args()
    variants: dict[str, Path] = {}
    if args.reference_tree is not None and args.only != "current":
        variants["reference"] = args.reference_tree.resolve()
    if args.only != "reference":
        variants["current"] = ROOT
    print(f"load average {os.getloadavg()[0]:.1f}; kind {args.kind}; variants {', '.join(variants)}", flush=True)
    if args.kind == "mysql":
        work = Path(tempfile.mkdtemp(prefix="hw-bigtxn-", dir=args.keep))
        try:
            run_mysql([int(n) for n in args.changes.split(",")], variants, work, args.spill_threshold_bytes)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    server, stop = start_server()
    work = Path(tempfile.mkdtemp(prefix="hw-bigtxn-", dir=args.keep))
    try:
        for changes in (int(n) for n in args.changes.split(",")):
            run_size(server, changes, variants, work, args.spill_threshold_bytes)
    finally:
        stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
