"""Positions of the ``headwater_log`` data source: where a read starts, ends, and how it splits.

A :class:`LogPosition` is the next offset to read in every partition of the topics a
query reads; it is what Spark stores in its checkpoint (as :meth:`LogPosition.to_json`,
``{"<topic>": {"<partition>": <offset>}}``, the Kafka source's shape). A micro-batch
reads ``[start, end)`` per partition, so a restart from the checkpoint re-reads nothing
that was committed and skips nothing that was not.

Pure: no log access. Offsets may have gaps (compaction, retention), so offset
differences count records at most, never at least.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from spark_log.errors import LogSourceOptionError

#: Kafka's sentinels inside a JSON offsets option: earliest held / end of the partition.
EARLIEST = -2
LATEST = -1


@dataclass(frozen=True, slots=True)
class LogPosition:
    """Next offset to read per ``(topic, partition)``; partitions absent from it start at their beginning."""

    offsets: tuple[tuple[str, int, int], ...] = ()

    @classmethod
    def of(cls, offsets: Mapping[tuple[str, int], int]) -> LogPosition:
        """Build from ``{(topic, partition): offset}`` (kept sorted, so equal positions serialise alike)."""
        return cls(tuple(sorted((topic, partition, offset) for (topic, partition), offset in offsets.items())))

    def as_dict(self) -> dict[tuple[str, int], int]:
        """``{(topic, partition): offset}``."""
        return {(topic, partition): offset for topic, partition, offset in self.offsets}

    def get(self, topic: str, partition: int) -> int | None:
        """The offset of one partition, or ``None`` when the position does not name it."""
        for name, number, offset in self.offsets:
            if name == topic and number == partition:
                return offset
        return None

    def to_json(self) -> dict[str, dict[str, int]]:
        """The checkpointed form: ``{"<topic>": {"<partition>": offset}}`` (JSON keys are strings)."""
        out: dict[str, dict[str, int]] = {}
        for topic, partition, offset in self.offsets:
            out.setdefault(topic, {})[str(partition)] = offset
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LogPosition:
        """Inverse of :meth:`to_json`."""
        return cls.of(
            {
                (topic, int(partition)): int(offset)
                for topic, parts in data.items()
                for partition, offset in parts.items()
            }
        )


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition: one Spark input partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        """Offsets in the range (an upper bound of its records: offsets may have gaps)."""
        return max(0, self.end - self.start)


@dataclass(frozen=True, slots=True)
class OffsetsSpec:
    """A ``startingOffsets``/``endingOffsets`` option: ``earliest``, ``latest`` or explicit per partition.

    Explicit offsets use Kafka's sentinels -2 (earliest) and -1 (latest); a partition the
    option does not name takes ``default``.
    """

    default: Literal["earliest", "latest"]
    explicit: tuple[tuple[str, int, int], ...] = ()

    @classmethod
    def parse(
        cls, option: str, text: str | None, topics: Iterable[str], default: Literal["earliest", "latest"]
    ) -> OffsetsSpec:
        """Parse the option's text; ``{"0": 5}`` is accepted for a single topic, else ``{"topic": {"0": 5}}``."""
        names = list(topics)
        if text is None or not text.strip():
            return cls(default)
        word = text.strip().lower()
        if word in ("earliest", "latest"):
            return cls("earliest" if word == "earliest" else "latest")
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            msg = f"expected 'earliest', 'latest' or JSON such as {{\"{names[0]}\": {{\"0\": 42}}}}, got {text!r}"
            raise LogSourceOptionError(msg, option=option) from None
        if not isinstance(data, dict):
            msg = f"expected a JSON object, got {text!r}"
            raise LogSourceOptionError(msg, option=option)
        if data and all(not isinstance(value, dict) for value in data.values()):
            if len(names) != 1:
                msg = 'with several topics give offsets per topic: {"<topic>": {"<partition>": offset}}'
                raise LogSourceOptionError(msg, option=option)
            data = {names[0]: data}
        explicit: list[tuple[str, int, int]] = []
        for topic, parts in data.items():
            if topic not in names:
                msg = f"names topic {topic!r}, which the query does not read ({', '.join(names)})"
                raise LogSourceOptionError(msg, option=option)
            if not isinstance(parts, dict):
                msg = f"offsets of topic {topic!r} must be an object of partition -> offset"
                raise LogSourceOptionError(msg, option=option)
            for partition, offset in parts.items():
                if not str(partition).isdigit() or not isinstance(offset, int) or offset < EARLIEST:
                    msg = f"{topic}/{partition}: offsets are integers >= 0, or -2 (earliest) / -1 (latest)"
                    raise LogSourceOptionError(msg, option=option)
                explicit.append((topic, int(partition), offset))
        return cls(default, tuple(sorted(explicit)))

    def resolve(self, topic: str, partition: int, *, beginning: int, end: int) -> int:
        """The offset this spec means for one partition, given the partition's current bounds."""
        chosen: int | str = self.default
        for name, number, offset in self.explicit:
            if name == topic and number == partition:
                chosen = offset
        if chosen in ("earliest", EARLIEST):
            return beginning
        if chosen in ("latest", LATEST):
            return end
        assert isinstance(chosen, int)
        return chosen


def offset_ranges(start: LogPosition, end: LogPosition, *, split_records: int) -> list[OffsetRange]:
    """The non-empty ranges from ``start`` to ``end``, each at most ``split_records`` offsets long.

    One range per partition, several when a partition has more than ``split_records``
    offsets to read, so a large backlog spreads over Spark's cores.
    """
    if split_records < 1:
        msg = f"split_records must be positive, got {split_records}"
        raise ValueError(msg)
    ranges: list[OffsetRange] = []
    for topic, partition, stop in end.offsets:
        first = start.get(topic, partition)
        begin = 0 if first is None else first
        while begin < stop:
            upper = min(stop, begin + split_records)
            ranges.append(OffsetRange(topic, partition, begin, upper))
            begin = upper
    return ranges


def admit(start: LogPosition, available: LogPosition, max_records: int) -> LogPosition:
    """The end of a micro-batch of at most ``max_records`` offsets from ``start`` towards ``available``.

    The budget is shared in proportion to each partition's backlog (as Kafka's
    ``maxOffsetsPerTrigger``); rounding leftovers go to the partitions in order, so a
    batch always advances when anything is available and ``max_records >= 1``.
    """
    if max_records < 1:
        msg = f"max_records must be positive, got {max_records}"
        raise ValueError(msg)
    backlog: dict[tuple[str, int], tuple[int, int]] = {}
    for topic, partition, stop in available.offsets:
        first = start.get(topic, partition)
        begin = 0 if first is None else first
        backlog[(topic, partition)] = (begin, max(begin, stop))
    total = sum(stop - begin for begin, stop in backlog.values())
    if total <= max_records:
        return LogPosition.of({where: stop for where, (_, stop) in backlog.items()})
    grant = {where: (stop - begin) * max_records // total for where, (begin, stop) in backlog.items()}
    left = max_records - sum(grant.values())
    for where, (begin, stop) in backlog.items():
        if left == 0:
            break
        extra = min(left, stop - begin - grant[where])
        grant[where] += extra
        left -= extra
    return LogPosition.of({where: begin + grant[where] for where, (begin, _) in backlog.items()})


#: A record's estimated bytes (key and value, as the log holds them before compression) from
#: ``offset`` on in ``(topic, partition)``: see :func:`admit_bytes`.
RecordBytes = Callable[[str, int, int], float]


def admit_bytes(start: LogPosition, end: LogPosition, max_bytes: int, record_bytes: RecordBytes) -> LogPosition:
    """``end``, or an earlier end when ``[start, end)`` holds more than about ``max_bytes`` of records.

    Each partition's records are estimated at ``record_bytes`` (a sample at the batch's start);
    an end past the budget is cut to the records the budget holds at their mean size, shared as
    :func:`admit` shares a record budget, so a batch still advances by at least one record.
    """
    if max_bytes < 1:
        msg = f"max_bytes must be positive, got {max_bytes}"
        raise ValueError(msg)
    records, estimated = 0, 0.0
    for topic, partition, stop in end.offsets:
        begin = start.get(topic, partition) or 0
        if stop > begin:
            records += stop - begin
            estimated += (stop - begin) * record_bytes(topic, partition, begin)
    if estimated <= max_bytes:
        return end
    return admit(start, end, max(1, int(records * max_bytes / estimated)))
