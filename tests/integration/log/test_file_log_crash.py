"""The file backend under SIGKILL: acknowledged batches survive exactly once, none is ever seen in part.

A writer process appends batches whose every record carries ``batch id : batch size :
index`` and prints the id once ``append`` has returned (acknowledged). It is killed
at a random moment, many times over; a new writer continues each time. A reader process
tails the partition throughout and reports any batch it saw only part of.

Every other writer updates the partition's recovery point after each append (interval 0
instead of 1 s), so kills also land between a batch's fsync, the point's write and the
acknowledgement: such a writer's point must cover every batch it acknowledged, and no
next writer may find damage before a point (a point ahead of the durable bytes would
make a healthy partition unopenable).
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.topics import partition_records

from log.base import TopicSpec
from log.file.backend import FileLog
from log.file.batch_codec import parse_header
from log.file.recovery_point import load_recovery_point
from log.file.segment import segment_name

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "crash"
#: Each kill costs a writer start (~0.5 s). 20 kills at random moments (0-150 ms after the first
#: acknowledged batch, so mid-fsync, mid-write and between batches) with batches of 1-300 records
#: roll segments and leave torn tails many times over (was 30: ~17 s of CI time).
KILLS = 20
BUDGET_S = 40.0

WRITER = """
import random, sys
from pathlib import Path
from log.file import partition_writer
from log.base import Record
from log.file.backend import FileLog

root, run = Path(sys.argv[1]), int(sys.argv[2])
rng = random.Random(run)
if run % 2:
    partition_writer.RECOVERY_POINT_INTERVAL_S = 0.0
log = FileLog(root, fsync="always", segment_bytes=256 * 1024)
i = 0
while True:
    batch_id = run * 1_000_000 + i
    size = rng.randint(1, 300)
    pad = b"x" * rng.randint(0, 400)
    records = [Record(b"%d" % (j % 17), b"%d:%d:%d:" % (batch_id, size, j) + pad) for j in range(size)]
    log.append("crash", 0, records)
    sys.stdout.write(f"{batch_id}\\n")
    sys.stdout.flush()
    i += 1
"""

READER = """
import json, os, sys, time
from pathlib import Path
from log.file.backend import FileLog

root, stop_file = Path(sys.argv[1]), Path(sys.argv[2])
log = FileLog(root)
offset, pending, batches, violations, reads = 0, None, 0, [], 0
while True:
    stopping = stop_file.exists()
    records = log.read("crash", 0, offset, max_records=5000)
    reads += 1
    if not records:
        if pending is not None:
            violations.append(f"saw {pending[2]} of {pending[1]} records of batch {pending[0]} at the end")
        if stopping:
            break
        time.sleep(0.002)
        continue
    for record in records:
        batch_id, size, index = (int(x) for x in record.value.split(b":")[:3])
        if pending is None:
            if index != 0:
                violations.append(f"batch {batch_id} starts at index {index} (offset {record.offset})")
            pending = [batch_id, size, 0]
        elif (batch_id, index) != (pending[0], pending[2]):
            violations.append(f"batch {pending[0]} cut after {pending[2]} records by {batch_id}:{index}")
            pending = [batch_id, size, index]
        pending[2] += 1
        if pending[2] == pending[1]:
            batches += 1
            pending = None
    offset = records[-1].offset + 1
print(json.dumps({"batches": batches, "violations": violations[:20], "reads": reads}))
"""


def batch_at_recovery_point(root: Path) -> int:
    """The batch id of the last record before the partition's recovery point."""
    directory = root / TOPIC / "0"
    point = load_recovery_point(directory)
    assert point is not None
    data = (directory / segment_name(point.segment_base)).read_bytes()[: point.end]
    position, next_offset = 0, point.segment_base
    while position < len(data):
        header = parse_header(data, position)
        position, next_offset = position + header.length, header.next_offset
    assert position == point.end, "the recovery point is not at a batch boundary"
    if next_offset == 0:
        return -1
    with FileLog(root) as log:
        [record] = log.read(TOPIC, 0, next_offset - 1, max_records=1)
    return int(record.value.split(b":")[0])


def test_sigkilled_writer_loses_no_acknowledged_batch_and_readers_never_see_part_of_one(tmp_path):
    root = tmp_path / "log"
    with FileLog(root) as log:
        log.create_topic(TopicSpec(TOPIC, partitions=1, compacted=False))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    stop_file = tmp_path / "stop-reader"
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(root), str(stop_file)], stdout=subprocess.PIPE, text=True, env=env
    )
    rng = random.Random(1234)
    acknowledged: list[int] = []
    kills = 0
    started = time.monotonic()
    try:
        for run in range(1, KILLS + 1):
            if time.monotonic() - started > BUDGET_S:
                break
            writer = subprocess.Popen(
                [sys.executable, "-c", WRITER, str(root), str(run)], stdout=subprocess.PIPE, text=True, env=env
            )
            first = writer.stdout.readline()
            assert first, f"writer {run} died before its first append"
            time.sleep(rng.uniform(0.0, 0.15))
            writer.send_signal(signal.SIGKILL)
            writer.wait()
            kills += 1
            acked = [int(first)] + [int(line) for line in writer.stdout.read().split()]
            acknowledged += acked
            if run % 2:
                covered = batch_at_recovery_point(root)
                assert covered >= acked[-1], f"writer {run}: recovery point covers {covered}, acknowledged {acked[-1]}"
    finally:
        stop_file.touch()
        report = json.loads(reader.communicate(timeout=60)[0])
    assert kills >= 10
    assert report["violations"] == []
    assert report["batches"] > 0

    with FileLog(root) as log:
        seen: dict[int, list[int]] = {}
        sizes: dict[int, int] = {}
        order: list[int] = []
        records = partition_records(log, TOPIC, 0, offset=0)
        for record in records:
            batch_id, size, index = (int(x) for x in record.value.split(b":")[:3])
            if index == 0:
                order.append(batch_id)
            sizes[batch_id] = size
            seen.setdefault(batch_id, []).append(index)
        assert (records[-1].offset + 1 if records else 0) == log.end_offset(TOPIC, 0)
    assert len(order) == len(set(order)), "a batch was stored twice"
    for batch_id, indexes in seen.items():
        assert indexes == list(range(sizes[batch_id])), f"batch {batch_id} incomplete, duplicated or interleaved"
    missing = [b for b in acknowledged if b not in seen]
    assert missing == [], f"{len(missing)} acknowledged batches lost"
    assert len(acknowledged) > kills
    print(f"{kills} kills, {len(acknowledged)} acknowledged batches, {len(seen)} stored, reader saw {report}")
