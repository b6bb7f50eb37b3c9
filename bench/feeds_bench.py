"""Feeds bench: log -> SQL feed -> log for the three kinds of feed, against a bare read of the same records.

A raw table topic of N change events (4 columns, keyed by id, 2 partitions) is written to
a fresh file log; then, in one Spark session:

* reference: a plain batch read of the topic through the ``headwater_log`` source into
  Spark's ``noop`` sink (every record decoded, nothing written);
* feed ``clean`` (plan class ``projection``): ``headwater feeds run --available-now`` of
  ``SELECT id, lower(name) AS name, country FROM source WHERE balance >= 0`` (latest per key
  in the source reader, SQL in Spark, pairing and JSON encoding on the driver in Arrow,
  batch-marked append to the feed topic), micro-batches of ``--batch`` records;
* feed ``by_country`` (``aggregate``): ``SELECT country, count(*), sum(balance), max(balance)
  FROM source GROUP BY country`` over the same topic (a maintained view: the state store,
  the groups each batch touches recomputed, differences written);
* feed ``with_region`` (``join``): each customer with its country's region from a 5-row
  lookup topic, keyed by id.

"Steady" means a warm process, as a feed that keeps running: before the measured runs each
measured feed's own SQL (so its own kind: the one pass, or a maintained view's stateful
query) runs over a warm-up topic (``--warmup`` events, default three micro-batches of 200k:
class loading, code generation, the JIT's C2 compilations of the generated stages, ICU's
case tables, Python workers), and the measured run's first micro-batch (query start) is
left out. Events are the log records each micro-batch read (its offset ranges), not Spark's
``numInputRows`` (fewer: the source keeps one row per key and micro-batch). Each micro-batch's
line shows its CPU per 100k events, so a share still falling from batch to batch (not steady
yet) is visible. Besides wall-clock rates the bench prints CPU seconds per 100k events of
this process and its descendants by role (this process: the ``foreachBatch`` driver work;
the JVM; Spark's Python workers): on a machine shared with other jobs that is the number
that does not move with the load; the load average is printed with it.

    .venv/bin/python bench/feeds_bench.py [--events 5400000] [--keys 400000] [--batch N] [--warmup 600000]
                                          [--general] [--feeds clean,by_country,with_region]

``--batch`` defaults to the feed job's own micro-batch size (``feed_job.DEFAULT_MAX_RECORDS`` for the
one pass, ``feed_job.MAINTAINED_MAX_RECORDS`` for maintained views); the warm-ups run 200k-record
micro-batches unless ``--batch`` is given. The default 5.4M events are three full micro-batches of a
maintained view (two steady ones). Events cycle over ``--keys`` keys, so a micro-batch larger than
the keys holds repeated changes of a key, which the reader folds into one row (``latestPerKey``):
``--keys`` at least ``--events`` measures the feeds with no folding at all.
``--general`` runs the projection feed as a maintained view (plan class ``projection (maintained)``);
``--feeds`` picks which of the three run (default all).
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

from capture.postgres.events.source_block import postgres_source
from core.config import load_config
from derived_feeds import feed_job
from derived_feeds.feed_job import run_feeds
from log.base import Record, TopicSpec, append_keyed
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from log.factory import open_log
from log.topics import SCHEMAS_TOPIC
from spark_log.data_source import register_log_source
from spark_log.session import spark_session, stop_spark

#: The warm-ups' micro-batch (records).
WARMUP_BATCH = 200_000
TOPIC = "shop.public.customers"
WARMUP_TOPIC = "shop.public.customers_warmup"
REGIONS_TOPIC = "shop.public.countries"
SQL = "SELECT id, lower(name) AS name, country FROM source WHERE balance >= 0"
FEEDS = {
    "clean": {"from": TOPIC, "sql": SQL, "key": ["id"]},
    "by_country": {
        "from": TOPIC,
        "sql": "SELECT country, count(*) AS n, sum(balance) AS total, max(balance) AS top FROM source GROUP BY country",
        "key": ["country"],
    },
    "with_region": {
        "from": TOPIC,
        "lookups": {"countries": REGIONS_TOPIC},
        "sql": "SELECT c.id, c.name, r.region FROM source c LEFT JOIN countries r ON c.country = r.code",
        "key": ["id"],
    },
}
ROLES = ("driver", "jvm", "python")
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


def write_source(config_path: Path, events: int, keys: int, topic: str = TOPIC) -> None:
    log = open_log(load_config(config_path))
    try:
        log.create_topic(TopicSpec(topic, partitions=2))
        log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
        columns = [{"name": n, "type_oid": o, "typmod": t, "key": k} for n, o, t, k in COLUMNS]
        schema = {"topic": topic, "schema": "public", "table": "customers", "columns": columns, "version": 1}
        log.append(SCHEMAS_TOPIC, 0, [Record(topic.encode(), orjson.dumps(schema))])
        countries = ["PT", "DE", "MX", "US", "JP"]
        chunk: list[Record] = []
        for i in range(events):
            key = i % keys
            source = postgres_source(
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
                append_keyed(log, topic, chunk)
                chunk = []
        if chunk:
            append_keyed(log, topic, chunk)
    finally:
        log.close()


def write_regions(config_path: Path) -> None:
    """The join feed's lookup: country code -> region, 5 rows."""
    log = open_log(load_config(config_path))
    try:
        log.create_topic(TopicSpec(REGIONS_TOPIC, partitions=2))
        columns = [{"name": "code", "type_oid": 25, "typmod": -1, "key": True}]
        columns.append({"name": "region", "type_oid": 25, "typmod": -1, "key": False})
        schema = {"topic": REGIONS_TOPIC, "schema": "public", "table": "countries", "columns": columns, "version": 1}
        log.append(SCHEMAS_TOPIC, 0, [Record(REGIONS_TOPIC.encode(), orjson.dumps(schema))])
        regions = {"PT": "EU", "DE": "EU", "MX": "AM", "US": "AM", "JP": "AS"}
        records = []
        for i, (code, region) in enumerate(regions.items()):
            source = postgres_source("shop", "shop", "public", "countries", i, i, 1_000 + i, 0, 1_600_000_000_000_000)
            event = ChangeEvent(Op.READ, source, None, {"code": code, "region": region}, 0)
            records.append(Record(encode_key({"code": code}), encode_value(event)))
        append_keyed(log, REGIONS_TOPIC, records)
    finally:
        log.close()


def per_100k(cpu: dict[str, float], rows: int) -> str:
    """``total (driver d, jvm j, python p)`` CPU seconds per 100k events."""
    per = {role: cpu[role] / rows * 100_000 for role in ROLES}
    return f"{sum(per.values()):.2f} (" + ", ".join(f"{role} {per[role]:.2f}" for role in ROLES) + ")"


def events_read(progress: Any) -> int:
    """The log records a micro-batch consumed (its sources' offset ranges).

    Not ``numInputRows``: read with ``latestPerKey`` the source hands Spark one row per key and
    micro-batch, fewer than the events it read.
    """
    events = 0
    for source in progress["sources"]:
        start, end = (orjson.loads(source[o] or "null") or {} for o in ("startOffset", "endOffset"))
        for topic, partitions in end.items():
            events += sum(n - int(start.get(topic, {}).get(p, 0)) for p, n in partitions.items())
    return events


def measure(spark: Any, config: Any, log: Any, name: str, args: argparse.Namespace, bare: float) -> None:
    """Run feed ``name`` over the whole topic and print its batches, steady rate and CPU per 100k events."""
    listener = CpuAtProgress()
    spark.streams.addListener(listener)
    cpu, start = tree_cpu_by_role(), time.perf_counter()
    listener.cpu[-1] = cpu  # batch 0's line: from the query's start
    [(query, plan)] = run_feeds(spark, config, log, [name], available_now=True, max_records_per_batch=args.batch)
    overall = args.events / (time.perf_counter() - start)
    end_cpu = tree_cpu_by_role()
    time.sleep(2)  # the listener hears the last progress asynchronously
    spark.streams.removeListener(listener)
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    steady = batches[1:] or batches
    events = {p["batchId"]: events_read(p) for p in batches}
    print(f"{name} ({plan.plan_class}), load {load_average()}:")
    for p in batches:
        rows, ms, batch_id = events[p["batchId"]], p["durationMs"]["triggerExecution"], p["batchId"]
        line = f"  batch {batch_id}: {rows:,} events in {ms / 1000:.2f} s ({rows / ms * 1000:,.0f} events/s)"
        if batch_id in listener.cpu and batch_id - 1 in listener.cpu:
            spent = {role: listener.cpu[batch_id][role] - listener.cpu[batch_id - 1][role] for role in ROLES}
            line += f", CPU s per 100k {per_100k(spent, rows)}"
        print(line)
    rate = sum(events[p["batchId"]] for p in steady) / sum(p["durationMs"]["triggerExecution"] for p in steady) * 1000
    written = sum(log.end_offset(name, p) for p in range(2))
    print(f"  overall (incl. planning, query start): {overall:,.0f} events/s; {written:,} records written")
    ids = [p["batchId"] for p in steady if p["batchId"] in listener.cpu and p["batchId"] - 1 in listener.cpu]
    spent = {role: sum(listener.cpu[i][role] - listener.cpu[i - 1][role] for i in ids) for role in ROLES}
    steady_rows = sum(events[p["batchId"]] for p in steady if p["batchId"] in ids)
    steady_text = per_100k(spent, steady_rows) if steady_rows else "n/a"
    whole = per_100k({role: end_cpu[role] - cpu[role] for role in ROLES}, args.events)
    print(f"  CPU s per 100k events: steady {steady_text}, incl. batch 0 and start {whole}")
    plans = plan.one_pass.plans if plan.one_pass is not None else 0
    print(f"  {plan.stats}, one-pass plans: {plans}, load average now: {load_average()}")
    print(
        f"feed {name}: {rate:,.0f} events/s (bare log read: {bare:,.0f} events/s, ratio {rate / bare:.2f})", flush=True
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=5_400_000)
    parser.add_argument("--keys", type=int, default=400_000)
    parser.add_argument("--batch", type=int, default=None, help="records per micro-batch (default: the feed job's)")
    parser.add_argument("--warmup", type=int, default=3 * WARMUP_BATCH, help="warm-up events (0: none)")
    parser.add_argument("--general", action="store_true", help="the projection as a maintained view")
    parser.add_argument("--feeds", default=",".join(FEEDS), help="which feeds to run (comma-separated)")
    args = parser.parse_args()
    if args.general:  # the one pass is tried only where the feed key holds the source key
        feed_job._unique_key = lambda log, spec: False  # type: ignore[assignment]
    root = Path(tempfile.mkdtemp(prefix="hw-feeds-bench-"))
    config_path = root / "headwater.yaml"
    names = [name.strip() for name in args.feeds.split(",") if name.strip()]
    feeds = {name: FEEDS[name] for name in names}
    # Each feed's own SQL over the warm-up topic.
    warmups = {f"warmup_{name}": {**FEEDS[name], "from": WARMUP_TOPIC} for name in names} if args.warmup else {}
    feeds.update(warmups)
    body = {"project": "bench", "home": str(root / "home"), "log": {"partitions": 2}, "feeds": feeds}
    config_path.write_text(yaml.safe_dump(body))
    start = time.perf_counter()
    write_source(config_path, args.events, args.keys)
    write_regions(config_path)
    if args.warmup:
        write_source(config_path, args.warmup, args.warmup // 2, WARMUP_TOPIC)
    print(
        f"wrote {args.events:,} events (+ {args.warmup:,} warm-up) in {time.perf_counter() - start:.1f} s", flush=True
    )

    config = load_config(config_path)
    spark = spark_session("feeds-bench", local_dir=root / "spark")
    log = open_log(config)
    try:
        register_log_source(spark)
        reader = spark.read.format("headwater_log").option("config", str(config_path)).option("topic", TOPIC)
        reader.load().write.format("noop").mode("overwrite").save()  # warm-up: workers, classes

        for warmup in warmups:
            start = time.perf_counter()
            batch = args.batch or WARMUP_BATCH
            run_feeds(spark, config, log, [warmup], available_now=True, max_records_per_batch=batch)
            print(f"{warmup}: {args.warmup:,} events in {time.perf_counter() - start:.1f} s (not measured)")
        for name in names:  # each against a bare read right before it (the load moves)
            before, start = tree_cpu_by_role(), time.perf_counter()
            reader.load().write.format("noop").mode("overwrite").save()
            bare = args.events / (time.perf_counter() - start)
            after = tree_cpu_by_role()
            bare_text = per_100k({role: after[role] - before[role] for role in ROLES}, args.events)
            print(f"bare log read: {bare:,.0f} events/s, {bare_text} CPU s per 100k (load {load_average()})")
            measure(spark, config, log, name, args, bare)
    finally:
        log.close()
        stop_spark(spark)
        shutil.rmtree(root, ignore_errors=True)  # ~0.4 GB of log and checkpoints per run


if __name__ == "__main__":
    main()
