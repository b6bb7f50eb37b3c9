"""Feed batches onto the log: quarantine, fail, counts, and the batch-marker idempotent append."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest
from harness.topics import partition_records

from core.config import ExpectationConfig
from derived_feeds.errors import FeedConfigError, FeedExpectationError
from derived_feeds.expectations import Check, compile_checks
from derived_feeds.feed_writer import BatchMarker, append_once, plan_batch
from log.base import Record, TopicSpec
from log.file.backend import FileLog
from log.partitioner import partition_for


def value(key: int, email: str | None, op: str = "c") -> str:
    after = None if op == "d" else {"id": key, "email": email}
    return orjson.dumps({"before": None, "after": after, "source": {}, "op": op}).decode()


def batch(rows: list[tuple[int, str | None, str]], flags: list[bool]) -> pa.Table:
    return pa.table(
        {
            "key": [orjson.dumps({"id": k}).decode() for k, _, _ in rows],
            "op": [op for _, _, op in rows],
            "value": [value(k, e, op) for k, e, op in rows],
            "dropped_value": [None if ok else value(k, None, "d") for (k, _, _), ok in zip(rows, flags, strict=True)],
            "__hw_ok0": flags,
        }
    )


def test_drop_quarantines_each_failing_row_and_deletes_its_key():
    check = Check(0, "expect_column_values_to_not_be_null", "email", "drop")
    rows = [(1, "a@x", "c"), (2, None, "u"), (3, None, "c"), (4, None, "d")]
    plan = plan_batch("f", batch(rows, [True, False, False, True]), [check], BatchMarker("r", 0))
    assert [orjson.loads(r.key)["id"] for r in plan.quarantine] == [2, 3]
    headers = dict(plan.quarantine[0].headers)
    assert headers["headwater.expectation"] == b"expect_column_values_to_not_be_null"
    assert b"email = null" in headers["headwater.error"]
    ops = [(orjson.loads(r.key)["id"], None if r.value is None else orjson.loads(r.value)["op"]) for r in plan.records]
    assert ops == [(1, "c"), (2, "d"), (2, None), (3, "d"), (3, None), (4, "d"), (4, None)]
    assert (plan.counts[0].passed, plan.counts[0].failed) == (1, 2)  # deletes are not evaluated


def test_fail_stops_with_one_line_naming_feed_expectation_and_sample():
    check = Check(0, "expect_column_values_to_not_be_null", "email", "fail")
    with pytest.raises(FeedExpectationError) as error:
        plan_batch("customers_clean", batch([(1, None, "c")], [False]), [check], BatchMarker("r", 0))
    message = str(error.value)
    assert "feed customers_clean" in message and "expect_column_values_to_not_be_null" in message
    assert "value null" in message and "\n" not in message


def test_unknown_expectation_or_column_is_a_config_error():
    from pyspark.sql.types import LongType, StructField, StructType

    output = StructType([StructField("id", LongType())])
    unknown = ExpectationConfig.model_validate(
        {"expect": "expect_column_values_to_be_fancy", "column": "id", "action": "warn"}
    )
    with pytest.raises(FeedConfigError, match=r": feeds\.f\.expectations\[0\]: expect_column_values_to_be_fancy"):
        compile_checks("f", [unknown], output)
    missing = ExpectationConfig.model_validate(
        {"expect": "expect_column_values_to_not_be_null", "column": "nope", "action": "drop"}
    )
    with pytest.raises(FeedConfigError, match=r"expectations\[0\]\.column: 'nope' is not an output column"):
        compile_checks("f", [missing], output)


def test_append_once_skips_partitions_that_hold_the_batch(tmp_path):
    log = FileLog(tmp_path / "log")
    try:
        log.create_topic(TopicSpec("f", partitions=2))
        marker = BatchMarker("run1", 5)
        records = [Record(orjson.dumps({"id": i}), b"{}", (marker.header(),)) for i in range(20)]
        assert append_once(log, "f", records, marker) == 20
        assert append_once(log, "f", records, marker) == 0, "a replay of batch 5 appends nothing"
        assert append_once(log, "f", records, BatchMarker("run2", 5)) == 20, "a new checkpoint is a new run"
        assert sum(log.end_offset("f", p) for p in range(2)) == 40
    finally:
        log.close()


def test_append_once_on_a_split_topic_looks_for_the_marker_where_the_records_go(tmp_path):
    log = FileLog(tmp_path / "log")
    try:
        log.create_topic(TopicSpec("f", partitions=2))
        log.split_partition("f", 0)
        marker = BatchMarker("run1", 6)
        records = [Record(orjson.dumps({"id": i}), b"{}", (marker.header(),)) for i in range(30)]
        assert append_once(log, "f", records, marker) == 30
        assert append_once(log, "f", records, marker) == 0, "a replay appends nothing"
        assert log.end_offset("f", 0) == 0, "nothing in the sealed parent"
        assert sum(log.end_offset("f", p) for p in range(4)) == 30
    finally:
        log.close()


def test_append_once_with_memo_skips_the_read_back_and_still_sees_other_writers(tmp_path):
    with FileLog(tmp_path / "log") as log:
        log.create_topic(TopicSpec("f", partitions=2))
        memo: dict = {}
        marker = BatchMarker("run1", 5)
        records = [Record(orjson.dumps({"id": i}), b"{}", (marker.header(),)) for i in range(20)]
        assert append_once(log, "f", records, marker, memo) == 20
        assert set(memo) == {("f", 0), ("f", 1)}
        assert append_once(log, "f", records, marker, memo) == 0, "a replay of batch 5 appends nothing"
        later = BatchMarker("run1", 6)
        assert append_once(log, "f", records, later, memo) == 20
        # Another writer moved partition 0's end: the memo no longer speaks for it, the log does.
        log.append("f", 0, [Record(b'{"id":99}', b"{}", (BatchMarker("run1", 9).header(),))])
        assert append_once(log, "f", records, BatchMarker("run1", 7), memo) == sum(
            1 for r in records if partition_for(r.key, 2) == 1
        )


def old_records(table, checks, marker):
    """The records plan_batch built one ``Record`` at a time before it kept the columns."""
    header = (marker.header(),)
    flags = {c.index: table.column(c.flag).to_pylist() for c in checks if c.action == "drop"}
    out = []
    for index, (key, op, val, dropped) in enumerate(
        zip(*(table.column(n).to_pylist() for n in ("key", "op", "value", "dropped_value")), strict=True)
    ):
        if op != "d" and any(flags[i][index] is False for i in flags):
            val, op = dropped, "d"
        out.append(Record(key.encode(), val.encode(), header))
        if op == "d":
            out.append(Record(key.encode(), None, header))
    return out


class NotAFileLog:
    """A real file log behind another type: append_once takes the path of logs that need Record objects."""

    def __init__(self, log):
        self._log = log
        self.appended = []

    def __getattr__(self, name):
        if name == "append_encoded":  # the capability a file log has and this one does not
            raise AttributeError(name)
        return getattr(self._log, name)

    def append(self, topic, partition, records):
        self.appended.append(type(records))
        return self._log.append(topic, partition, records)


def read_all(log, topic, partitions):
    return {p: [(r.key, r.value, r.headers) for r in partition_records(log, topic, p)] for p in range(partitions)}


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_columnar_append_writes_what_the_record_path_writes_and_replays_nothing(tmp_path, compression):
    check = Check(0, "expect_column_values_to_not_be_null", "email", "drop")
    rows = [(i, None if i % 5 == 0 else f"é{i}@x", "d" if i % 7 == 0 else "u") for i in range(300)]
    table = batch(rows, [r[1] is not None or r[2] == "d" for r in rows])
    marker = BatchMarker("run1", 3)
    plan = plan_batch("f", table, [check], marker)
    expected = old_records(table, [check], marker)
    assert [(r.key, r.value, r.headers) for r in plan.records] == [(r.key, r.value, r.headers) for r in expected]
    assert (plan.upserts, plan.deletes) == (
        sum(1 for _, e, op in rows if op != "d" and e is not None),
        sum(1 for _, e, op in rows if op == "d" or e is None),
    )
    assert len(plan.records) == plan.upserts + 2 * plan.deletes
    with FileLog(tmp_path / "columns", compression=compression) as log, FileLog(tmp_path / "records") as ref:
        for target in (log, ref):
            target.create_topic(TopicSpec("f", partitions=3))
        memo: dict = {}
        assert append_once(log, "f", plan.records, marker, memo) == len(expected)
        assert append_once(ref, "f", expected, marker) == len(expected)
        assert read_all(log, "f", 3) == read_all(ref, "f", 3)
        assert append_once(log, "f", plan.records, marker, memo) == 0, "a replay of batch 3 appends nothing"
        assert append_once(log, "f", plan.records, marker) == 0, "without the memo the last record says so"
        other = NotAFileLog(log)
        later = BatchMarker("run1", 4)
        replanned = plan_batch("f", table, [check], later).records
        assert append_once(other, "f", replanned, later) == len(expected)
        assert set(other.appended) == {list}, "a log that is no file log gets Record objects"
        assert sum(log.end_offset("f", p) for p in range(3)) == 2 * len(expected)
        assert append_once(other, "f", replanned, later) == 0, "the Record path replays nothing either"


def test_plan_without_checks_keeps_the_columns_and_counts_deletes():
    rows = [(1, "a", "c"), (2, "b", "u"), (3, None, "d"), (4, "c", "r")]
    table = batch(rows, [True] * 4).drop_columns(["__hw_ok0"])
    plan = plan_batch("f", table, [], BatchMarker("r", 0))
    assert (plan.upserts, plan.deletes, len(plan.records)) == (3, 1, 5)
    expected = old_records(table, [], BatchMarker("r", 0))
    assert [(r.key, r.value) for r in plan.records] == [(r.key, r.value) for r in expected]
    assert plan.quarantine == [] and plan.counts == []
