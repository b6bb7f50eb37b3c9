"""Memory of ``load`` and ``feeds run`` working off a backlog: peak memory (PSS) per process role, in bytes.

Writes a raw table topic of ``--events`` change events over ``--keys`` keys (2 partitions; the
columns of ``bench/feeds_bench.py`` plus a ``notes`` text column of ``--pad`` bytes, so the
bytes per record can be varied) into a fresh file log, then runs, each as a real CLI process:

* ``headwater load --available-now`` of one SCD1 table from the topic (default micro-batch:
  ``load_job.start_load`` ``max_records_per_batch``, 200k records);
* ``headwater feeds run --available-now`` of a one-pass projection feed (1.2M records per
  micro-batch) and a maintained aggregate (1.8M).

PSS of the command's process tree (RSS with shared pages split among their sharers, so the
sum is what the tree takes) is sampled from ``/proc/<pid>/smaps_rollup`` every 0.2 s, by role: ``driver``
(the CLI's Python: ``foreachBatch``, the micro-batch as Arrow), ``jvm`` (Spark's driver and
executors, ``local[2]``), ``python`` (Spark's Python workers, the source's planner). Printed per
command: the peak of each role and of their sum, the micro-batch records and the log's bytes per
record, with the load average.

    .venv/bin/python bench/backlog_memory_bench.py [--events 10000000] [--keys 1000000] [--pad 0]
        [--commands load,feeds]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson
import yaml

from capture.postgres.events.source_block import postgres_source
from core.config import load_config
from log.base import Record, TopicSpec, append_keyed
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from log.factory import open_log
from log.topics import SCHEMAS_TOPIC

TOPIC = "shop.public.customers"
COLUMNS = [
    ("id", 20, -1, True),
    ("name", 25, -1, False),
    ("country", 25, -1, False),
    ("balance", 1700, 655366, False),
    ("notes", 25, -1, False),
]
FEEDS = {
    "clean": {"from": TOPIC, "sql": "SELECT id, lower(name) AS name, country, notes FROM source", "key": ["id"]},
    "by_country": {
        "from": TOPIC,
        "sql": "SELECT country, count(*) AS n, sum(balance) AS total FROM source GROUP BY country",
        "key": ["country"],
    },
}
COMMANDS = {"load": ["load", "--available-now"], "feeds": ["feeds", "run", "--available-now"]}


def write_source(config_path: Path, events: int, keys: int, pad: int) -> int:
    """The topic and its schema record; returns the bytes the topic takes on disk."""
    config = load_config(config_path)
    log = open_log(config)
    try:
        log.create_topic(TopicSpec(TOPIC, partitions=2))
        log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
        columns = [{"name": n, "type_oid": o, "typmod": t, "key": k} for n, o, t, k in COLUMNS]
        schema = {"topic": TOPIC, "schema": "public", "table": "customers", "columns": columns, "version": 1}
        log.append(SCHEMAS_TOPIC, 0, [Record(TOPIC.encode(), orjson.dumps(schema))])
        countries = ["PT", "DE", "MX", "US", "JP"]
        notes = ("n" * pad) if pad else None
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
                "notes": notes,
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
    return sum(p.stat().st_size for p in (config.home_dir / "log" / TOPIC).rglob("*.log"))


def tree(root: int) -> list[int]:
    """``root`` and its live descendants."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += [child for child, parent in parents.items() if parent == pid]
    return found


def rss_by_role(root: int) -> dict[str, int]:
    """PSS (a shared page counted once over the processes sharing it) of the tree, by role."""
    roles = {"driver": 0, "jvm": 0, "python": 0}
    for pid in tree(root):
        try:
            status = Path(f"/proc/{pid}/smaps_rollup").read_text()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:
            continue
        rss = next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("Pss:")), 0)
        role = "driver" if pid == root else "jvm" if b"java" in command else "python"
        roles[role] += rss
    return roles


def run(config_path: Path, command: list[str]) -> tuple[dict[str, int], float, str]:
    """Run one CLI command; the peak PSS of each role and of their sum (``total``), its wall time."""
    process = subprocess.Popen(
        [sys.executable, "-m", "headwater", "--config", str(config_path), *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peaks = {"driver": 0, "jvm": 0, "python": 0, "total": 0}
    started = time.perf_counter()

    def sample() -> None:
        while process.poll() is None:
            roles = rss_by_role(process.pid)
            for role, value in roles.items():
                peaks[role] = max(peaks[role], value)
            peaks["total"] = max(peaks["total"], sum(roles.values()))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = process.communicate()
    sampler.join()
    if process.returncode != 0:
        msg = f"{' '.join(command)} exited {process.returncode}: {err[-2000:]}{spark_causes(config_path.parent)}"
        raise SystemExit(msg)
    return peaks, time.perf_counter() - started, out.strip().splitlines()[-1] if out.strip() else ""


def spark_causes(work: Path) -> str:
    """The first exception lines of the run's ``spark.log`` (the work directory is removed at exit)."""
    lines = []
    for log in work.rglob("spark.log"):
        text = log.read_text(errors="replace").splitlines()
        lines += [line for line in text if "Exception" in line or "Error" in line or "Caused by" in line][:12]
    return "\nspark.log:\n" + "\n".join(lines) if lines else ""


def mib(value: int) -> str:
    return f"{value / 2**20:,.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--pad", type=int, default=0, help="bytes of the notes column of every row")
    parser.add_argument("--commands", default="load,feeds")
    parser.add_argument("--driver-memory", default=None, help="spark: driver_memory (default: Headwater's, 1g)")
    parser.add_argument("--keep", action="store_true", help="leave the work directory (its spark.log) and print it")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hw-backlog-"))
    try:
        config_path = work / "headwater.yaml"
        document = {
            "project": "backlog",
            "log": {"partitions": 2, "file": {"fsync": "never"}},
            "feeds": FEEDS,
            "warehouse": {"tables": {"customers": {"from": TOPIC, "mode": "scd1"}}},
        }
        if args.driver_memory:
            document["spark"] = {"driver_memory": args.driver_memory}
        config_path.write_text(yaml.safe_dump(document))
        started = time.perf_counter()
        size = write_source(config_path, args.events, args.keys, args.pad)
        with open_log(load_config(config_path)) as log:
            sample = log.read(TOPIC, 0, 0, max_records=1000)
        per_record = sum(len(r.value or b"") + len(r.key or b"") for r in sample) / len(sample)
        print(
            f"wrote {args.events:,} events over {args.keys:,} keys ({per_record:.0f} bytes per record as JSON, "
            f"{size / args.events:.0f} on disk zstd) in {time.perf_counter() - started:.0f} s; "
            f"load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        for name in args.commands.split(","):
            peaks, wall, last = run(config_path, COMMANDS[name])
            roles = ", ".join(f"{role} {mib(peaks[role])}" for role in ("driver", "jvm", "python"))
            print(
                f"{name}: peak PSS {mib(peaks['total'])} in all ({roles}); {wall:.0f} s wall; "
                f"load {os.getloadavg()[0]:.1f}; {last}",
                flush=True,
            )
    finally:
        if args.keep:
            print(f"kept {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
