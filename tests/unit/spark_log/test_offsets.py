"""Offsets of the log source: positions, option parsing, range splitting, admission control."""

from __future__ import annotations

import pytest

from spark_log.errors import LogSourceOptionError
from spark_log.offsets import LogPosition, OffsetRange, OffsetsSpec, admit, admit_bytes, offset_ranges


def pos(**parts):
    return LogPosition.of({("t", int(p[1:])): o for p, o in parts.items()})


def test_position_json_round_trip_is_sorted_and_stable():
    position = LogPosition.of({("b", 1): 5, ("a", 0): 3, ("b", 0): 7})
    assert position.to_json() == {"a": {"0": 3}, "b": {"0": 7, "1": 5}}
    assert LogPosition.from_json(position.to_json()) == position
    assert position.get("b", 1) == 5
    assert position.get("c", 0) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, {0: 10, 1: 20}),
        ("earliest", {0: 10, 1: 20}),
        ("LATEST", {0: 100, 1: 200}),
        ('{"0": 15}', {0: 15, 1: 20}),
        ('{"t": {"0": -1, "1": 12}}', {0: 100, 1: 12}),
        ('{"t": {"1": -2}}', {0: 10, 1: 20}),
    ],
)
def test_offsets_spec_resolves(text, expected):
    spec = OffsetsSpec.parse("startingOffsets", text, ["t"], "earliest")
    bounds = {0: (10, 100), 1: (20, 200)}
    got = {p: spec.resolve("t", p, beginning=b, end=e) for p, (b, e) in bounds.items()}
    assert got == expected


@pytest.mark.parametrize(
    ("text", "topics", "message"),
    [
        ("soon", ["t"], "expected 'earliest'"),
        ("[1]", ["t"], "JSON object"),
        ('{"0": 1}', ["t", "u"], "several topics"),
        ('{"x": {"0": 1}}', ["t"], "does not read"),
        ('{"t": {"0": -3}}', ["t"], "-2 \\(earliest\\)"),
        ('{"t": {"a": 1}}', ["t"], "integers"),
    ],
)
def test_offsets_spec_rejects(text, topics, message):
    with pytest.raises(LogSourceOptionError, match=message) as caught:
        OffsetsSpec.parse("startingOffsets", text, topics, "earliest")
    assert caught.value.option == "startingOffsets"


def test_ranges_split_long_partitions_and_skip_empty_ones():
    start = pos(p0=0, p1=5)
    end = pos(p0=25, p1=5, p2=3)  # p2 is new: starts at 0
    assert offset_ranges(start, end, split_records=10) == [
        OffsetRange("t", 0, 0, 10),
        OffsetRange("t", 0, 10, 20),
        OffsetRange("t", 0, 20, 25),
        OffsetRange("t", 2, 0, 3),
    ]


def test_admit_shares_the_budget_by_backlog():
    start = pos(p0=0, p1=0, p2=50)
    available = pos(p0=100, p1=300, p2=50)
    end = admit(start, available, 40)
    assert end == pos(p0=10, p1=30, p2=50)


def test_admit_always_advances_and_never_exceeds():
    start = pos(p0=0, p1=0, p2=0)
    available = pos(p0=5, p1=5, p2=5)
    end = admit(start, available, 2)
    moved = sum(end.as_dict().values())
    assert moved == 2
    assert all(e <= 5 for e in end.as_dict().values())
    assert admit(start, available, 100) == available


def test_admit_bytes_keeps_an_end_within_the_budget():
    start, end = pos(p0=0, p1=10), pos(p0=100, p1=110)
    assert admit_bytes(start, end, 200 * 50, lambda topic, partition, offset: 50.0) == end


def test_admit_bytes_cuts_wide_records_to_the_budget_shared_by_backlog():
    start, end = pos(p0=0, p1=0), pos(p0=300, p1=100)
    sizes = {0: 1000.0, 1: 3000.0}  # 300 x 1000 + 100 x 3000 = 600,000 bytes, mean 1,500 a record
    seen = []

    def record_bytes(topic, partition, offset):
        seen.append((topic, partition, offset))
        return sizes[partition]

    cut = admit_bytes(start, end, 150_000, record_bytes)
    assert cut == pos(p0=75, p1=25)  # 100 records at the mean, shared 3:1 as the backlog is
    assert sorted(seen) == [("t", 0, 0), ("t", 1, 0)]  # sampled where the batch starts


def test_admit_bytes_always_advances_and_skips_partitions_without_backlog():
    start, end = pos(p0=5, p1=7), pos(p0=5, p1=9)
    asked = []
    cut = admit_bytes(start, end, 1, lambda topic, partition, offset: asked.append(partition) or 10_000.0)
    assert cut == pos(p0=5, p1=8)  # one record, though it alone is over the budget
    assert asked == [1]
    with pytest.raises(ValueError, match="positive"):
        admit_bytes(start, end, 0, lambda *_: 1.0)


def test_admit_repeated_reaches_the_end_in_ceil_steps():
    position, target, steps = pos(p0=0, p1=0), pos(p0=17, p1=4), 0
    while position != target:
        position = admit(position, target, 5)
        steps += 1
    assert steps == 5  # 21 offsets, 5 per batch
