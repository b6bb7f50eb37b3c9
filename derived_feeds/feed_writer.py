"""A feed micro-batch onto the log: records, quarantine, expectation counts, and an idempotent append.

Exactly once: Spark's checkpoint replays a micro-batch whose commit it did not record, so
every record of micro-batch ``b`` carries the header ``headwater.feed.batch`` =
``<run>:<b>`` (``run``: an id kept beside the checkpoint, new with a new checkpoint).
Before appending to a partition the writer reads that partition's last record: if it
already carries this run's marker for ``b`` or a later batch, the partition's share was
appended before the crash and is skipped. One append per partition is atomic, so a
partition holds all of a batch's records or none of them.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
import pyarrow.compute as pc  # type: ignore[import-untyped]

from derived_feeds.errors import FeedExpectationError
from derived_feeds.expectations import EXPECTATION_HEADER, Check
from log.base import Log, Record
from log.column_records import ColumnRecords
from log.encoded_batches import AppendsEncodedBatches
from log.envelope import Op
from log.partitioner import partitions_for
from log.shards import shard_map_of
from log.topics import ERROR_HEADER

#: Header marking the micro-batch a record was written by.
BATCH_HEADER = "headwater.feed.batch"
_RUN_FILE = "feed_run.json"


@dataclass(frozen=True, slots=True)
class BatchMarker:
    """``(run, batch_id)`` of one micro-batch of one checkpoint."""

    run: str
    batch_id: int

    def header(self) -> tuple[str, bytes]:
        """The header every record of the batch carries."""
        return (BATCH_HEADER, f"{self.run}:{self.batch_id}".encode())

    def covers(self, headers: Iterable[tuple[str, bytes]]) -> bool:
        """True when a record with ``headers`` was written by this run at this batch or later."""
        for name, value in headers:
            if name == BATCH_HEADER:
                run, _, batch = value.decode().rpartition(":")
                return run == self.run and batch.isdigit() and int(batch) >= self.batch_id
        return False


def checkpoint_run(checkpoint: Path) -> str:
    """The run id kept beside ``checkpoint`` (created on first use; gone with the checkpoint)."""
    path = checkpoint / _RUN_FILE
    try:
        return str(orjson.loads(path.read_bytes())["run"])
    except FileNotFoundError:
        checkpoint.mkdir(parents=True, exist_ok=True)
        run = uuid.uuid4().hex[:16]
        path.write_bytes(orjson.dumps({"run": run}))
        return run


@dataclass
class CheckCount:
    """Rows of one micro-batch that met / failed one expectation."""

    check: Check
    passed: int = 0
    failed: int = 0


@dataclass
class PlannedBatch:
    """What one micro-batch writes: feed records, quarantine records, and expectation counts.

    ``records`` is a :class:`ColumnRecords` (the encoded Arrow columns themselves) when planned
    from a batch: the file log appends it without a ``Record`` per row.
    """

    records: Sequence[Record] = field(default_factory=list)
    quarantine: list[Record] = field(default_factory=list)
    counts: list[CheckCount] = field(default_factory=list)
    upserts: int = 0
    deletes: int = 0


def _sample(value: bytes, column: str) -> str:
    after = orjson.loads(value).get("after") or {}
    return orjson.dumps(after.get(column)).decode()


def plan_batch(feed: str, table: pa.Table, checks: Sequence[Check], marker: BatchMarker) -> PlannedBatch:
    """Turn the encoded batch (``key``, ``op``, ``value``, ``dropped_value``, check flags) into records.

    Every row is a record carrying the batch marker; a delete is followed by its tombstone; a
    row a ``drop`` expectation fails is quarantined (original value, the reason in headers)
    and written to the feed as its ``dropped_value`` delete instead.
    Raises :class:`FeedExpectationError` when a ``fail`` expectation fails (nothing is written).
    """
    plan = PlannedBatch()
    rows = table.num_rows
    ops = table.column("op")
    is_delete = pc.fill_null(pc.equal(ops, Op.DELETE.value), False)
    upsert = pc.fill_null(pc.not_equal(ops, Op.DELETE.value), False)  # a null op is neither: not evaluated
    flags: dict[int, Any] = {}
    for check in checks:
        ok = pc.fill_null(table.column(check.flag), True)
        failing = pc.and_(pc.invert(ok), upsert)
        failed = pc.sum(failing).as_py() or 0
        evaluated = pc.sum(upsert).as_py() or 0
        plan.counts.append(CheckCount(check, evaluated - failed, failed))
        flags[check.index] = failing
        if check.action == "fail" and failed and (evaluated - failed) < check.mostly * evaluated:
            first = pc.index(failing, True).as_py()
            value = table.column("value")[first].as_py().encode()
            raise FeedExpectationError(feed, check.expectation, check.column, _sample(value, check.column), failed)
    header = (marker.header(),)
    keys, values = table.column("key"), table.column("value")
    # A row the first failing drop check takes out of the feed: quarantined, then deleted from the feed.
    dropped_by: dict[int, Check] = {}
    dropped = None
    for check in (c for c in checks if c.action == "drop"):
        failing = flags[check.index]
        if pc.any(failing).as_py():
            for index in pc.indices_nonzero(failing).to_pylist():
                dropped_by.setdefault(index, check)
            dropped = failing if dropped is None else pc.or_(dropped, failing)
    if dropped is not None:
        plan.quarantine = _quarantine(table, sorted(dropped_by.items()), marker)
        values = pc.if_else(dropped, table.column("dropped_value"), values)
        is_delete = pc.or_(is_delete, dropped)
    records = ColumnRecords(keys, values, is_delete, header)
    plan.records = records
    plan.deletes = records.delete_count
    plan.upserts = rows - plan.deletes
    return plan


def _quarantine(table: pa.Table, dropped: Sequence[tuple[int, Check]], marker: BatchMarker) -> list[Record]:
    """The quarantine records of the dropped rows ``(index, check)``: the original value, the reason in headers."""
    indices = pa.array([index for index, _ in dropped], pa.int64())
    keys = table.column("key").take(indices).cast(pa.binary()).to_pylist()
    values = table.column("value").take(indices).cast(pa.binary()).to_pylist()
    out = []
    for (_, check), key, value in zip(dropped, keys, values, strict=True):
        reason = f"{check.describe()} failed: {check.column} = {_sample(value, check.column)}"
        headers = (marker.header(), (EXPECTATION_HEADER, check.expectation.encode()), (ERROR_HEADER, reason.encode()))
        out.append(Record(key, value, headers))
    return out


#: What a process appended last per ``(topic, partition)``: the partition's end after it, and the batch.
AppendMemo = dict[tuple[str, int], tuple[int, BatchMarker]]


def append_once(
    log: Log, topic: str, records: Sequence[Record], marker: BatchMarker, memo: AppendMemo | None = None
) -> int:
    """Append ``records`` routed by key, skipping partitions that already hold this batch; records written.

    ``memo`` (kept by the caller across batches) remembers this process's last append per
    partition: while the partition's end is still where that append left it, its last
    record is known without reading it back (a read decodes the whole last batch).
    A :class:`ColumnRecords` goes to a file log as its encoded per-partition batches (no
    ``Record`` per row, the same bytes); any other log takes its records.
    """
    if not records:
        return 0
    partitions = log.describe_topic(topic).partitions
    # A split topic (log.shards): route to the open partitions now, so the marker is looked for where it goes.
    shards = shard_map_of(log, topic)
    by_partition: dict[int, Sequence[Record]]
    encoded = log if isinstance(records, ColumnRecords) and isinstance(log, AppendsEncodedBatches) else None
    if shards is not None:
        encoded = None
    if encoded is not None and isinstance(records, ColumnRecords):
        now_ms = time.time_ns() // 1_000_000  # what the file log stamps a record without a timestamp with
        batches = encoded.column_batches(records, partitions, now_ms)
        by_partition = {partition: batch for partition, batch in enumerate(batches) if batch is not None}
    else:
        grouped: dict[int, list[Record]] = {}
        listed = records.records() if isinstance(records, ColumnRecords) else records
        keys = [r.key for r in listed]
        targets = partitions_for(keys, partitions) if shards is None else shards.route_all(keys)
        for record, partition in zip(listed, targets, strict=True):
            grouped.setdefault(partition, []).append(record)
        by_partition = dict(grouped)
    written = 0
    for partition, batch in sorted(by_partition.items()):
        if _already_appended(log, topic, partition, marker, memo):
            continue
        if encoded is not None:
            result = encoded.append_encoded(topic, partition, batch)
        else:
            result = log.append(topic, partition, batch)
        if memo is not None:
            memo[(topic, partition)] = (result.last_offset + 1, marker)
        written += len(batch)
    return written


def _already_appended(log: Log, topic: str, partition: int, marker: BatchMarker, memo: AppendMemo | None) -> bool:
    end = log.end_offset(topic, partition)
    known = memo.get((topic, partition)) if memo is not None else None
    if known is not None and known[0] == end:  # nothing appended since this process's last append
        return marker.covers((known[1].header(),))
    if end <= log.beginning_offset(topic, partition):
        return False
    last = log.read(topic, partition, end - 1, max_records=1)
    return bool(last) and marker.covers(last[-1].headers)


def record_quality(home: Path, feed: str, topic: str, marker: BatchMarker, counts: Sequence[CheckCount]) -> None:
    """Append this batch's expectation counts to ``<home>/quality/feeds.jsonl`` (one JSON object per check)."""
    if not counts:
        return
    path = home / "quality" / "feeds.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC).isoformat()
    lines = [
        orjson.dumps(
            {
                "feed": feed,
                "topic": topic,
                "run": marker.run,
                "batch_id": marker.batch_id,
                "at": now,
                "expectation": c.check.expectation,
                "column": c.check.column,
                "action": c.check.action,
                "passed": c.passed,
                "failed": c.failed,
            }
        )
        for c in counts
    ]
    with path.open("ab") as handle:
        handle.write(b"\n".join(lines) + b"\n")
