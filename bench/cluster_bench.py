"""Cluster bench (issue 17): the same feed and load on ``local[2]`` vs a Spark standalone cluster,
and the ceiling of committing to Delta on the driver with delta-rs.

Part 1, in one run: a raw table topic of ``--events`` change events (``--keys`` keys, 2
partitions, file log with ``log.file.shared: true``: every node of a one-host cluster sees it)
is copied into two project homes. Each home runs, in its own Spark session, ``feeds run
--available-now`` of a 3-column SQL feed and ``load --available-now`` of an SCD1 table of the
raw topic (library calls, as the CLI makes them): once with ``spark.master: local[2]``, once
against a standalone master with two one-core workers (512 MB executors) started from
pyspark's ``bin/spark-class`` (the tests' harness). Both use the same 2 cores: the ratio is
the cost of distributing the work (executor JVMs, shuffles over the network stack, task
scheduling), not a speed-up. "steady" leaves out each query's first micro-batch (of 200k
events: query start, Python workers, class loading).

Part 2: the driver's delta-rs commits alone (no Spark): ``--commit-changes`` changes per
table, micro-batches of ``--commit-batch``, through ``write_scd1`` (plan + tombstones + one
MERGE per batch), for one table and for ``--tables`` tables side by side (one thread each,
as the driver runs the foreachBatch functions of concurrent loads), on local disk and on
S3 (moto_server on this host).

    .venv/bin/python bench/cluster_bench.py [--events 600000] [--keys 300000] [--tables 4]
        [--commit-changes 400000] [--commit-batch 50000] [--skip cluster|commits] [--cluster-first]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]

from feeds_bench import TOPIC, load_average, write_source  # noqa: E402
from warehouse_bench import batches, make_changes  # noqa: E402

from core.config import load_config  # noqa: E402
from derived_feeds.feed_job import run_feeds  # noqa: E402
from log.factory import open_log  # noqa: E402
from spark_log.job import open_session  # noqa: E402
from spark_log.session import stop_spark  # noqa: E402
from warehouse_loader.delta.table import open_delta  # noqa: E402
from warehouse_loader.delta.writer import write_scd1  # noqa: E402
from warehouse_loader.load_job import run_loads, table_path  # noqa: E402
from warehouse_loader.location import TableLocation  # noqa: E402

SQL = "SELECT id, lower(name) AS name, country FROM source WHERE balance >= 0"
CLUSTER_CONF = {"spark.executor.memory": "512m", "spark.executor.cores": "1", "spark.cores.max": "2"}


def project(root: Path, name: str, master: str) -> Path:
    spark: dict[str, Any] = {"master": master}
    if not master.startswith("local"):
        spark["conf"] = CLUSTER_CONF
    body = {
        "project": "bench",
        "home": str(root / name),
        "log": {"partitions": 2, "file": {"shared": True}},
        "spark": spark,
        "feeds": {"clean": {"from": TOPIC, "sql": SQL, "key": ["id"]}},
        "warehouse": {"tables": {"customers": {"from": TOPIC, "mode": "scd1"}}},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def steady_rate(query: Any) -> float:
    """Events/s of the query's micro-batches after its first (query start, first-batch warm-up left out)."""
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    steady = batches[1:] or batches
    rows = sum(p["numInputRows"] for p in steady)
    return rows / sum(p["durationMs"]["triggerExecution"] for p in steady) * 1000


def feed_and_load(config_path: Path, events: int) -> dict[str, float]:
    """Session start, feed, load (seconds) for one project home."""
    config = load_config(config_path)
    log = open_log(config)
    started = time.perf_counter()
    spark = open_session(config, "cluster-bench")
    times = {"session": time.perf_counter() - started}
    try:
        started = time.perf_counter()
        [(feed, _plan)] = run_feeds(spark, config, log, ["clean"], available_now=True)
        times["feed"] = time.perf_counter() - started
        started = time.perf_counter()
        [load] = run_loads(spark, config, log, ["customers"], available_now=True)
        times["load"] = time.perf_counter() - started
        times["feed steady"], times["load steady"] = steady_rate(feed), steady_rate(load)
        rows = open_delta(table_path(config, "customers"))
        assert rows is not None and rows.to_pyarrow_table(columns=["id"]).num_rows > 0
    finally:
        log.close()
        stop_spark(spark)
    return times


def part_cluster(args: argparse.Namespace, root: Path) -> None:
    from harness.spark_cluster import SparkCluster, cluster_unavailable

    missing = cluster_unavailable()
    if missing:
        print(f"cluster part skipped: {missing}")
        return
    local = project(root, "local", "local[2]")
    started = time.perf_counter()
    write_source(local, args.events, args.keys)
    print(f"wrote {args.events:,} events ({args.keys:,} keys) in {time.perf_counter() - started:.1f} s", flush=True)
    cluster = SparkCluster(root / "spark-cluster")
    started = time.perf_counter()
    cluster.start()
    print(f"standalone cluster (master + 2 workers) up in {time.perf_counter() - started:.1f} s", flush=True)
    remote = project(root, "cluster", cluster.url)
    shutil.copytree(root / "local" / "log", root / "cluster" / "log")
    try:
        results = {}
        order = [("local[2]", local), ("cluster", remote)]
        for name, path in reversed(order) if args.cluster_first else order:
            print(f"{name}: running (load {load_average()})", flush=True)
            results[name] = times = feed_and_load(path, args.events)
            print(
                f"{name}: session {times['session']:.1f} s; feed {times['feed']:.1f} s "
                f"({args.events / times['feed']:,.0f} events/s, steady {times['feed steady']:,.0f}); "
                f"load {times['load']:.1f} s ({args.events / times['load']:,.0f} events/s, "
                f"steady {times['load steady']:,.0f}) (load average {load_average()})",
                flush=True,
            )
    finally:
        cluster.stop()
    a, b = results["local[2]"], results["cluster"]
    print(
        f"cluster/local[2] throughput ratio: feed {a['feed'] / b['feed']:.2f} "
        f"(steady {b['feed steady'] / a['feed steady']:.2f}), load {a['load'] / b['load']:.2f} "
        f"(steady {b['load steady'] / a['load steady']:.2f})"
    )


def commit_tables(locations: list[TableLocation], parts: list[Any]) -> float:
    """Write every part into every location, one thread per table; events/s over all tables."""
    errors: list[BaseException] = []

    def writer(where: TableLocation) -> None:
        try:
            for batch_id, part in enumerate(parts):
                write_scd1(where, part, table=where.name, batch_id=batch_id, keys=["id"])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(where,)) for where in locations]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return sum(part.num_rows for part in parts) * len(locations) / elapsed


def part_commits(args: argparse.Namespace, root: Path) -> None:
    from harness.broker import MotoS3
    from harness.moto import create_bucket, moto_unavailable, warehouse_options

    parts = batches(make_changes(args.commit_changes, args.commit_changes // 2), args.commit_batch)
    print(f"driver commits: {args.commit_changes:,} changes per table in {len(parts)} batches", flush=True)
    stores: list[tuple[str, Any]] = [("local disk", lambda n: TableLocation(str(root / "commits" / n)))]
    s3 = None
    if moto_unavailable() is None:
        s3 = MotoS3().start()
        create_bucket(s3, "benchwh")
        options = tuple(sorted(warehouse_options(s3).items()))
        stores.append(("S3 (moto)", lambda n: TableLocation(f"s3://benchwh/{n}", options)))
    try:
        for store, location in stores:
            for count in sorted({1, args.tables}):
                names = [f"t{count}_{i}" for i in range(count)]
                rate = commit_tables([location(n) for n in names], parts)
                print(
                    f"  {store}, {count} table(s) side by side: {rate:,.0f} events/s in all "
                    f"({rate / count:,.0f} per table) (load {load_average()})",
                    flush=True,
                )
    finally:
        if s3 is not None:
            s3.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=600_000)
    parser.add_argument("--keys", type=int, default=300_000)
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--commit-changes", type=int, default=400_000)
    parser.add_argument("--commit-batch", type=int, default=50_000)
    parser.add_argument("--cluster-first", action="store_true", help="run the cluster before local[2]")
    parser.add_argument("--skip", choices=("cluster", "commits"), action="append", default=[])
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hw-cluster-bench-"))
    try:
        if "cluster" not in args.skip:
            part_cluster(args, root)
        if "commits" not in args.skip:
            part_commits(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
