"""Resync reconcile: time, CPU and peak memory of finding the keys a source lost while its slot was gone.

Builds a file-log topic of N keys (every second one deleted later, with its tombstone:
a table with delete history), then runs ``capture.postgres.snapshot.resync.vanished_key_deletes`` the way
the agent does (re-snapshot keys in a :class:`~capture.key_set.KeySet`, deletes appended
as generated) for two scenarios:

* ``history``: the re-snapshot finds every live key except 1 in 10 (those vanished);
* ``massdelete``: it finds none (every live key vanished while the slot was gone).

Reference measured in the same run: a bare read of the same topic (every record, the
columnar path the reconcile uses), so the ratio says what the reconcile adds to reading.

    .venv/bin/python bench/resync_bench.py [--keys 1000000]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capture.key_set import KEY_SET_FILE, KeySet
from capture.postgres.events.source_block import postgres_source
from capture.postgres.snapshot.resync import vanished_key_deletes
from log.base import Record, TopicSpec
from log.envelope import ChangeEvent, Op, encode_value
from log.file.backend import FileLog
from log.partitioner import partition_for
from log.reading import read_range_columns

TOPIC = "shop.public.customers"
PARTITIONS = 3


def key(i: int) -> bytes:
    return b'{"id":%d}' % i


def event(op: Op, i: int, lsn: int) -> bytes:
    source = postgres_source("shop", "shop", "public", "customers", 7, lsn, lsn, 0, 1_000_000)
    row = {
        "id": i,
        "email": f"user{i}@example.com",
        "name": f"Customer number {i}",
        "country": "NZ",
        "balance": "1234.56",
        "created_at": "2026-11-21T20:00:00.000000Z",
        "notes": "x" * 120,
    }
    after = row if op != Op.DELETE else None
    before = row if op == Op.DELETE else None
    return encode_value(ChangeEvent(op=op, source=source, before=before, after=after))


def build(directory: Path, n: int) -> None:
    with FileLog(directory / "log") as log:
        log.create_topic(TopicSpec(TOPIC, partitions=PARTITIONS))
        for phase in ("create", "delete"):
            for lo in range(0, n, 20_000):
                batches: dict[int, list[Record]] = {}
                for i in range(lo, min(lo + 20_000, n)):
                    k = key(i)
                    bucket = batches.setdefault(partition_for(k, PARTITIONS), [])
                    if phase == "create":
                        bucket.append(Record(k, event(Op.CREATE, i, 100 + i)))
                    elif i % 2 == 0:
                        bucket.extend([Record(k, event(Op.DELETE, i, 100 + n + i)), Record(k, None)])
                for partition, records in batches.items():
                    log.append(TOPIC, partition, records)


def bare_read(directory: Path) -> str:
    with FileLog(directory / "log") as log:
        cpu0, t0 = time.process_time(), time.perf_counter()
        records = 0
        for partition in range(PARTITIONS):
            end = log.end_offset(TOPIC, partition)
            for columns in read_range_columns(log, TOPIC, partition, 0, end):
                records += len(columns.keys)
        return f"records={records} wall_s={time.perf_counter() - t0:.2f} cpu_s={time.process_time() - cpu0:.2f}"


def reconcile(directory: Path, n: int, scenario: str) -> str:
    scratch = Path(tempfile.mkdtemp(dir=directory))
    with FileLog(directory / "log") as log:
        present = KeySet(scratch / KEY_SET_FILE)
        present.add(TOPIC, ())
        if scenario == "history":
            for lo in range(0, n, 50_000):
                present.add(TOPIC, [key(i) for i in range(lo, min(lo + 50_000, n)) if i % 2 == 1 and i % 20 != 1])
        base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        cpu0, t0 = time.process_time(), time.perf_counter()
        deleted = 0
        pending: list[object] = []
        deletes = vanished_key_deletes(log, TOPIC, present, commit_lsn=10**12, first_index=1 << 40, ts_us=1)
        for record in deletes:
            pending.append(record)
            if record.value is None:
                deleted += 1
                if len(pending) >= 20_000:
                    pending = []  # the agent appends them here
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        growth_mib = (peak_kib - base_kib) / 1024
        spilled = present.spilled
        present.close()
    return (
        f"deletes={deleted} wall_s={wall:.2f} cpu_s={cpu:.2f} "
        f"peak_rss_mib={peak_kib / 1024:.0f} growth_mib={growth_mib:.0f} keys_spilled={spilled}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--phase", choices=("all", "read", "history", "massdelete"), default="all")
    parser.add_argument("--dir", type=Path)
    args = parser.parse_args()
    if args.phase != "all":  # one measurement per process, so peak RSS is its own
        if args.phase == "read":
            print(f"bare read: {bare_read(args.dir)}", flush=True)
        else:
            print(f"reconcile {args.phase}: {reconcile(args.dir, args.keys, args.phase)}", flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="hw-resync-bench-") as tmp:
        directory = Path(tmp)
        started = time.perf_counter()
        build(directory, args.keys)
        print(f"built {args.keys:,} keys (half deleted later) in {time.perf_counter() - started:.1f}s", flush=True)
        for phase in ("read", "history", "massdelete"):
            command = [sys.executable, __file__, "--keys", str(args.keys), "--phase", phase, "--dir", str(directory)]
            subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
