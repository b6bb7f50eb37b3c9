"""Feeds bench: log -> 3-column SQL feed -> log, against a bare read of the same records.

A raw table topic of N change events (4 columns, keyed by id, 2 partitions) is written to
a fresh file log; then, in one Spark session:

* reference: a plain batch read of the topic through the ``headwater_log`` source into
  Spark's ``noop`` sink (every record decoded, nothing written);
* feed: ``headwater feeds run --available-now`` of ``SELECT id, lower(name) AS name, country
  FROM source WHERE balance >= 0`` (latest per key in the source reader, SQL in Spark,
  pairing and JSON encoding on the driver in Arrow, batch-marked append to the feed topic),
  micro-batches of ``--batch`` records.

"Steady" leaves out the first micro-batch (JVM warm-up, Python workers start). Besides
wall-clock rates the bench prints CPU seconds per 100k events of this process and its
descendants (JVM, Python workers): on a machine shared with other jobs that is the
number that does not move with the load; the load average is printed with it.

    .venv/bin/python bench/feeds_bench.py [--events 800000] [--keys 400000] [--batch 200000]

``--batch`` defaults to the feed job's own micro-batch size (``feed_job.DEFAULT_MAX_RECORDS``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import yaml
from pyspark.sql.streaming.listener import StreamingQueryListener

from derived_feeds.feed_job import DEFAULT_MAX_RECORDS, run_feeds
from derived_feeds.log_source import register_log_source
from derived_feeds.session import spark_session, stop_spark
from headwater.config import load_config
from log.base import SCHEMAS_TOPIC, Record, TopicSpec, append_keyed
from log.envelope import ChangeEvent, Op, SourceInfo, encode_key, encode_value
from log.factory import open_log

TOPIC = "shop.public.customers"
COLUMNS = [("id", 20, -1, True), ("name", 25, -1, False), ("country", 25, -1, False), ("balance", 1700, 655366, False)]


def tree_cpu_by_role() -> dict[str, float]:
    """CPU seconds (user + system) of this process and its live descendants by role, from ``/proc``.

    Roles: ``driver`` (this process: foreachBatch pairing, encoding, append), ``jvm`` (Spark),
    ``python`` (Spark's Python workers: the source's reads and decoding, and the streaming
    source's planner process).
    """
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    reaped: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        # Own time, and (fields 16-17) that of children already reaped: Python workers come and go.
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
        reaped[int(entry.name)] = (int(fields[13]) + int(fields[14])) / tick
    roles = {"driver": 0.0, "jvm": 0.0, "python": 0.0}
    me = os.getpid()
    todo = [me]
    while todo:
        pid = todo.pop()
        if pid == me:
            role = "driver"
        else:
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                command = b""
            role = "jvm" if b"java" in command.split(b"\0", 1)[0] else "python"
        roles[role] += times.get(pid, 0.0)
        if pid != me:  # the JVM's and the Python daemon's reaped children are Python workers
            roles["python"] += reaped.get(pid, 0.0)
        todo += [child for child, parent in parents.items() if parent == pid]
    return roles


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and its live descendants."""
    return sum(tree_cpu_by_role().values())


class CpuAtProgress(StreamingQueryListener):
    """Tree CPU seconds when each micro-batch's progress arrives (steady-state CPU per event)."""

    def __init__(self) -> None:
        self.cpu: dict[int, dict[str, float]] = {}

    def onQueryStarted(self, event: Any) -> None:
        """Nothing to do."""

    def onQueryProgress(self, event: Any) -> None:
        """Record the CPU clock at the end of the batch."""
        self.cpu[event.progress.batchId] = tree_cpu_by_role()

    def onQueryIdle(self, event: Any) -> None:
        """Nothing to do."""

    def onQueryTerminated(self, event: Any) -> None:
        """Nothing to do."""


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def write_source(config_path: Path, events: int, keys: int) -> None:
    log = open_log(load_config(config_path))
    try:
        log.create_topic(TopicSpec(TOPIC, partitions=2))
        log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
        columns = [{"name": n, "type_oid": o, "typmod": t, "key": k} for n, o, t, k in COLUMNS]
        schema = {"topic": TOPIC, "schema": "public", "table": "customers", "columns": columns, "version": 1}
        log.append(SCHEMAS_TOPIC, 0, [Record(TOPIC.encode(), orjson.dumps(schema))])
        countries = ["PT", "DE", "MX", "US", "JP"]
        chunk: list[Record] = []
        for i in range(events):
            key = i % keys
            source = SourceInfo(
                "shop", "shop", "public", "customers", i, i, 1_000_000 + i // 4, i % 4, 1_700_000_000_000_000
            )
            after = {
                "id": key,
                "name": f"Customer-{key}",
                "country": countries[i % 5],
                "balance": f"{(i % 1000) - 50}.25",
            }
            event = ChangeEvent(Op.CREATE if i < keys else Op.UPDATE, source, None, after, 0)
            chunk.append(Record(encode_key({"id": key}), encode_value(event)))
            if len(chunk) == 50_000:
                append_keyed(log, TOPIC, chunk)
                chunk = []
        if chunk:
            append_keyed(log, TOPIC, chunk)
    finally:
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=800_000)
    parser.add_argument("--keys", type=int, default=400_000)
    parser.add_argument("--batch", type=int, default=DEFAULT_MAX_RECORDS)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hw-feeds-bench-"))
    config_path = root / "headwater.yaml"
    sql = "SELECT id, lower(name) AS name, country FROM source WHERE balance >= 0"
    body = {
        "project": "bench",
        "home": str(root / "home"),
        "log": {"partitions": 2},
        "feeds": {"clean": {"from": TOPIC, "sql": sql, "key": ["id"]}},
    }
    config_path.write_text(yaml.safe_dump(body))
    start = time.perf_counter()
    write_source(config_path, args.events, args.keys)
    print(f"wrote {args.events:,} events in {time.perf_counter() - start:.1f} s", flush=True)

    config = load_config(config_path)
    spark = spark_session("feeds-bench", local_dir=root / "spark")
    log = open_log(config)
    try:
        register_log_source(spark)
        reader = spark.read.format("headwater_log").option("config", str(config_path)).option("topic", TOPIC)
        reader.load().write.format("noop").mode("overwrite").save()  # warm-up: workers, classes
        before, start = tree_cpu_by_role(), time.perf_counter()
        reader.load().write.format("noop").mode("overwrite").save()
        bare = args.events / (time.perf_counter() - start)
        after = tree_cpu_by_role()
        bare_roles = {role: (after[role] - before[role]) / args.events * 100_000 for role in after}
        bare_cpu = sum(bare_roles.values())
        detail = ", ".join(f"{r} {v:.2f}" for r, v in bare_roles.items())
        print(f"bare log read: {bare:,.0f} events/s, {bare_cpu:.2f} CPU s per 100k ({detail}; load {load_average()})")

        listener = CpuAtProgress()
        spark.streams.addListener(listener)
        cpu, start = tree_cpu_s(), time.perf_counter()
        [(query, plan)] = [
            (q, p)
            for q, p in run_feeds(spark, config, log, ["clean"], available_now=True, max_records_per_batch=args.batch)
        ]
        overall = args.events / (time.perf_counter() - start)
        feed_cpu = (tree_cpu_s() - cpu) / args.events * 100_000
        batches = [p for p in query.recentProgress if p["numInputRows"]]
        for p in batches:
            rows, ms = p["numInputRows"], p["durationMs"]["triggerExecution"]
            print(f"  batch {p['batchId']}: {rows:,} events in {ms / 1000:.2f} s ({rows / ms * 1000:,.0f} events/s)")
        steady = batches[1:] or batches
        rate = sum(p["numInputRows"] for p in steady) / sum(p["durationMs"]["triggerExecution"] for p in steady) * 1000
        written = sum(log.end_offset("clean", p) for p in range(2))
        print(f"feed overall (incl. planning, query start): {overall:,.0f} events/s; {written:,} records written")
        time.sleep(2)  # the listener hears the last progress asynchronously
        ids = [p["batchId"] for p in steady if p["batchId"] in listener.cpu and p["batchId"] - 1 in listener.cpu]
        roles = {
            role: sum(listener.cpu[i][role] - listener.cpu[i - 1][role] for i in ids)
            for role in ("driver", "jvm", "python")
        }
        steady_rows = sum(p["numInputRows"] for p in steady if p["batchId"] in ids)
        if steady_rows:
            per = {role: seconds / steady_rows * 100_000 for role, seconds in roles.items()}
            steady_text = f"{sum(per.values()):.2f} (" + ", ".join(f"{r} {v:.2f}" for r, v in per.items()) + ")"
        else:
            steady_text = "n/a"
        print(
            f"  CPU s per 100k events: feed steady {steady_text}, feed incl. batch 0 and start {feed_cpu:.2f}, ", end=""
        )
        print(f"bare read {bare_cpu:.2f}")
        print(f"  load average now: {load_average()}")
        print(f"  {plan.stats}")
        print(f"feed: {rate:,.0f} events/s (bare log read: {bare:,.0f} events/s, ratio {rate / bare:.2f})")
    finally:
        log.close()
        stop_spark(spark)
        shutil.rmtree(root, ignore_errors=True)  # ~0.4 GB of log and checkpoints per run


if __name__ == "__main__":
    main()
