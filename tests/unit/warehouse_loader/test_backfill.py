"""Daily SCD2 backfill from the log's time index: rebuilt days match the events; other days stay."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable
from harness.table_formats import TableFormat, overwrite_rows

from capture.postgres.events.source_block import postgres_source
from core.config import load_config
from log.base import Record, TopicSpec, append_keyed
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from log.factory import open_log
from log.topics import SCHEMAS_TOPIC
from warehouse_loader.backfill import BackfillError, offset_ranges, rebuild_days
from warehouse_loader.changes import COMMIT_TS, END_AT, START_AT, changes_from_events
from warehouse_loader.formats import format_of
from warehouse_loader.load_job import table_path

TOPIC = "src.public.t"
DAYS = [dt.date(2026, 11, 10) + dt.timedelta(days=n) for n in range(5)]  # day 0 .. day 4
INT4, TEXT = 23, 25


def make_events() -> list[ChangeEvent]:
    """Keys 1-3 change every day; key 3 is deleted on day 2 and inserted again on day 3; key 2 deleted on day 4."""
    events: list[ChangeEvent] = []
    lsn = 1000
    for number, day in enumerate(DAYS):
        for hour, key in ((2, 1), (9, 2), (23, 3)):
            lsn += 10
            ts_us = int(dt.datetime.combine(day, dt.time(hour, 30), tzinfo=dt.UTC).timestamp() * 1_000_000)
            source = postgres_source("src", "db", "public", "t", lsn, lsn, lsn, 0, ts_us)
            if (key, number) in ((3, 2), (2, 4)):
                events.append(ChangeEvent(Op.DELETE, source, {"id": key, "label": None}, None, ts_us))
                continue
            op = Op.CREATE if number == 0 or (key, number) == (3, 3) else Op.UPDATE
            events.append(ChangeEvent(op, source, None, {"id": key, "label": f"k{key}-d{number}"}, ts_us))
    return events


def expected_versions(events: list[ChangeEvent]) -> list[tuple[int, str, str, str | None]]:
    """``(id, label, __START_AT, __END_AT)`` per upsert: each change opens a version, the next one closes it."""
    by_key: dict[int, list[ChangeEvent]] = {}
    for event in events:
        image = event.after if event.after is not None else event.before
        assert image is not None
        by_key.setdefault(int(image["id"]), []).append(event)
    versions = []
    for key, changes in by_key.items():
        changes.sort(key=lambda e: e.sequence.sortable())
        for event, following in zip(changes, [*changes[1:], None], strict=True):
            if event.op is Op.DELETE:
                continue
            assert event.after is not None
            end = None if following is None else following.sequence.sortable()
            versions.append((key, event.after["label"], event.sequence.sortable(), end))
    return sorted(versions)


def day_of(event: ChangeEvent) -> dt.date:
    return dt.datetime.fromtimestamp(event.source.ts_us / 1_000_000, dt.UTC).date()


@pytest.fixture
def project(tmp_path: Path):
    yield from make_project(tmp_path, "delta")


@pytest.fixture
def each_format(tmp_path: Path, table_format: TableFormat):
    """The project on each table format (the cases whose reads and writes go through the format)."""
    yield from make_project(tmp_path, table_format.name)


def make_project(tmp_path: Path, fmt: str):
    path = tmp_path / "headwater.yaml"
    document = {
        "project": "t",
        "home": str(tmp_path / "home"),
        "log": {"partitions": 2, "file": {"fsync": "never"}},
        "warehouse": {"format": fmt, "tables": {"hist": {"from": TOPIC, "mode": "scd2"}}},
    }
    path.write_text(yaml.safe_dump(document))
    config = load_config(path)
    log = open_log(config)
    columns = [{"name": "id", "type_oid": INT4, "typmod": -1, "key": True}]
    columns.append({"name": "label", "type_oid": TEXT, "typmod": -1, "key": False})
    schema = {"topic": TOPIC, "schema": "public", "table": "t", "replica_identity": "d", "columns": columns}
    log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
    log.append(SCHEMAS_TOPIC, 0, [Record(TOPIC.encode(), orjson.dumps({**schema, "version": 1}))])
    log.create_topic(TopicSpec(TOPIC, partitions=2))
    events = make_events()
    # As capture writes them: keyed, in commit order, stamped (here: exactly) at commit time.
    append_keyed(
        log,
        TOPIC,
        [
            Record(encode_key({"id": (e.after or e.before or {})["id"]}), encode_value(e), (), e.source.ts_us // 1000)
            for e in events
        ],
    )
    try:
        yield config, log, events
    finally:
        log.close()


def load(config, events: list[ChangeEvent]) -> None:
    """What the streaming load would have written from ``events``."""
    format_of(config, "hist").write_batch(
        table_path(config, "hist"),
        changes_from_events(events, ["id"]),
        table="hist",
        batch_id=0,
        keys=["id"],
        config=config.warehouse.tables["hist"],
    )


def stored(config) -> pa.Table:
    table = format_of(config, "hist").open(table_path(config, "hist"))
    assert table is not None
    return table.select("SELECT * FROM target")


def versions(config, days: list[dt.date] | None = None) -> list[tuple[int, str, str, str | None]]:
    rows = stored(config).to_pylist()
    if days is not None:
        rows = [r for r in rows if r[COMMIT_TS].date() in days]
    return sorted((r["id"], r["label"], r[START_AT], r[END_AT]) for r in rows)


def test_backfill_of_three_missing_days_yields_exactly_their_changes_and_stitches_neighbours(each_format):
    config, log, events = each_format
    load(config, [e for e in events if day_of(e) in (DAYS[0], DAYS[4])])  # days 1-3 never loaded
    before_edges = {day: versions(config, [day]) for day in (DAYS[0], DAYS[4])}

    ranges = offset_ranges(log, TOPIC, DAYS[1:4])
    assert sum(end - start for start, end in ranges.values()) == 9  # the time index: only days 1-3 are read

    result = rebuild_days(None, config, log, "hist", DAYS[1:4])

    assert result.removed == 0
    assert result.changes == 9
    for day in DAYS[1:4]:
        opened = {e.sequence.sortable() for e in events if day_of(e) == day}
        assert versions(config, [day]) == [v for v in expected_versions(events) if v[2] in opened], day
    assert versions(config) == expected_versions(events)
    # Day 4 untouched; day 0 only had its versions' ends moved to the rebuilt day 1 (the stitching).
    assert versions(config, [DAYS[4]]) == before_edges[DAYS[4]]
    assert [v[:3] for v in versions(config, [DAYS[0]])] == [v[:3] for v in before_edges[DAYS[0]]]


def test_backfill_replaces_wrong_versions_of_the_days_and_keeps_a_delete_on_a_later_day(each_format):
    config, log, events = each_format
    load(config, events)
    assert versions(config) == expected_versions(events)
    rows = stored(config)
    day2 = dt.datetime.combine(DAYS[2], dt.time(), tzinfo=dt.UTC)
    damaged = [r["label"] if r[COMMIT_TS] < day2 else "corrupt" for r in rows.to_pylist()]  # days 2-4
    at = rows.schema.get_field_index("label")
    overwrite_rows(config, "hist", rows.set_column(at, rows.schema.field(at), pa.array(damaged, pa.string())))

    result = rebuild_days(None, config, log, "hist", DAYS[2:4])

    assert result.removed == 5  # day 2: keys 1, 2 (key 3 deleted); day 3: keys 1, 2, 3
    expected = expected_versions(events)
    damaged_day_4 = [(k, "corrupt", s, e) for k, _, s, e in versions(config, [DAYS[4]])]
    assert versions(config, [DAYS[4]]) == damaged_day_4  # not rebuilt, so left as it was
    earlier = DAYS[:4]  # days 0-1 were never damaged, days 2-3 are rebuilt
    opened = {e.sequence.sortable() for e in events if day_of(e) in earlier}
    assert versions(config, earlier) == [v for v in expected if v[2] in opened]
    # Key 2's day-3 version is closed by its day-4 delete, which only that version's __END_AT recorded.
    key2 = [v for v in versions(config, [DAYS[3]]) if v[0] == 2]
    delete_seq = next(e.sequence.sortable() for e in events if e.op is Op.DELETE and day_of(e) == DAYS[4])
    assert key2 == [(2, "k2-d3", key2[0][2], delete_seq)]

    again = rebuild_days(None, config, log, "hist", DAYS[2:4])  # idempotent
    assert again.removed == 5
    assert versions(config, earlier) == [v for v in expected if v[2] in opened]


def test_only_scd2_tables_are_backfilled(project):
    config, log, _ = project
    with pytest.raises(BackfillError, match="not an SCD2 table"):
        rebuild_days(None, config, log, "nope", DAYS[:1])


def test_backfill_is_one_commit_so_readers_never_see_the_days_empty(project):
    config, log, events = project
    load(config, events)
    path = str(table_path(config, "hist"))
    day2 = dt.datetime.combine(DAYS[2], dt.time(), tzinfo=dt.UTC).isoformat()
    day4 = dt.datetime.combine(DAYS[4], dt.time(), tzinfo=dt.UTC).isoformat()
    DeltaTable(path).update({"label": "'corrupt'"}, predicate=f"{COMMIT_TS} >= '{day2}' AND {COMMIT_TS} < '{day4}'")
    before = DeltaTable(path).version()
    expected = [v for v in expected_versions(events) if v[2] in {e.sequence.sortable() for e in events}]
    rebuilt_days = DAYS[2:4]
    count_in_days = len(versions(config, rebuilt_days))

    seen: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            rows = DeltaTable(path).to_pyarrow_table().to_pylist()
            seen.append(sum(1 for r in rows if r[COMMIT_TS].date() in rebuilt_days))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        result = rebuild_days(None, config, log, "hist", rebuilt_days)
    finally:
        stop.set()
        thread.join()

    assert result.removed == count_in_days == 5
    after = DeltaTable(path).version()
    assert after == before + 1, "the backfill must be one commit of the table"
    assert versions(config) == expected
    # Every version a reader could have loaded holds the days in full: the old rows or the rebuilt ones.
    for version in range(before, after + 1):
        rows = DeltaTable(path, version=version).to_pyarrow_table().to_pylist()
        assert sum(1 for r in rows if r[COMMIT_TS].date() in rebuilt_days) == count_in_days, version
    assert seen and set(seen) == {count_in_days}
    assert DeltaTable(path).history(1)[0]["headwater.backfill"] == "2026-11-12,2026-11-13"
