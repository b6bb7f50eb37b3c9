"""Debezium's events against Headwater's, field by field, and a readable summary of what differs.

Events are compared per topic. Snapshot rows (``op: r``) are paired by their key (a keyless
table: by the row), so the order rows were read in does not matter, but their
``source.snapshot`` markers are compared like every other field. Every other record
(changes, tombstones, truncates, messages) is paired in order: each tool's records of a
topic, in the order it emitted them (Headwater: ``(commit_lsn, txn_index)``, a tombstone right
after its delete), aligned on ``(op, key)``; what cannot be aligned is an event only one tool
has.

A pair is compared on every field path of its key and value (``value.after.c_num``,
``value.source.snapshot``, ...), with these masks and no others:

* envelope ``ts_ms``/``ts_us``/``ts_ns`` are processing times: compared by presence;
* ``source.ts_*`` of snapshot rows are each tool's own snapshot time: compared by presence;
  ``source.ts_*`` of streamed events are the commit time and compared exactly.

Every difference found is either covered by a :class:`Deliberate` rule (an allow-list entry
with its reason) or is a failure.
"""

from __future__ import annotations

import difflib
import fnmatch
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from harness.topics import topic_records
from log.base import Log
from log.topics import is_quarantine_topic


class _Missing:
    def __repr__(self) -> str:
        return "<absent>"


#: A field one side does not have.
MISSING: Any = _Missing()
_PROCESSING_TIME = ("value.ts_ms", "value.ts_us", "value.ts_ns")
_SOURCE_TIME = ("value.source.ts_ms", "value.source.ts_us", "value.source.ts_ns")


@dataclass(frozen=True)
class Event:
    """One record as a tool emitted it: ``value`` None is a tombstone."""

    topic: str
    key: Any
    value: Mapping[str, Any] | None

    @property
    def op(self) -> str:
        """``c u d r t m``, ``tombstone``, or a transaction-metadata record's status (``BEGIN``/``END``)."""
        if self.value is None:
            return "tombstone"
        return str(self.value.get("op") or self.value.get("status") or "?")

    @property
    def snapshot(self) -> bool:
        """Read by an initial snapshot."""
        return self.op == "r"

    def identity(self) -> str:
        """What pairs a snapshot row with the other tool's: its key, or the row of a keyless table."""
        if self.key is not None:
            return _canonical(self.key)
        return _canonical((self.value or {}).get("after"))

    def signature(self) -> tuple[str, str]:
        """What aligns streamed records: op and key (a keyless table's row for its changes)."""
        if self.key is None and self.value is not None and self.op in "cud":
            return self.op, _canonical(self.value.get("after") or self.value.get("before"))
        return self.op, _canonical(self.key)


@dataclass(frozen=True)
class Difference:
    """One field that differs between a pair of events, or an event only one tool emitted (``path`` ``event``)."""

    mode: str
    topic: str
    op: str
    path: str
    debezium: Any
    headwater: Any

    def example(self) -> str:
        """``topic op: debezium=... headwater=...`` (long values shortened)."""
        return f"{self.topic} {self.op}: debezium={_short(self.debezium)} headwater={_short(self.headwater)}"


@dataclass(frozen=True)
class Deliberate:
    """An allow-list entry: differences at ``paths`` (fnmatch patterns) for which ``when`` holds, and why."""

    name: str
    reason: str
    paths: tuple[str, ...]
    when: Callable[[Difference], bool] = field(default=lambda _difference: True)

    def covers(self, difference: Difference) -> bool:
        """Whether this entry explains ``difference``."""
        return any(fnmatch.fnmatchcase(difference.path, p) for p in self.paths) and self.when(difference)


@dataclass
class Comparison:
    """The result for one mode: pairs compared and every difference, each with the rule that allows it (or None)."""

    mode: str
    pairs: int = 0
    debezium_events: int = 0
    headwater_events: int = 0
    differences: list[tuple[Difference, Deliberate | None]] = field(default_factory=list)
    #: Pairs compared per (topic, op): what the comparison covered.
    compared: Counter[tuple[str, str]] = field(default_factory=Counter)

    @property
    def unexpected(self) -> list[Difference]:
        """Differences no rule explains."""
        return [d for d, rule in self.differences if rule is None]

    def rules_used(self) -> set[str]:
        """Names of the rules that explained at least one difference."""
        return {rule.name for _, rule in self.differences if rule is not None}


def debezium_events(records: Iterable[Mapping[str, Any]]) -> list[Event]:
    """Records of a Debezium engine (``{"topic", "key", "value"}``), in emitted order."""
    return [Event(r["topic"], r["key"], r["value"]) for r in records]


def headwater_events(log: Log, source: str) -> list[Event]:
    """Every record of ``source``'s topics (quarantine topics left out) in the source's order.

    Order: ``(commit_lsn, txn_index)``; a tombstone has no value, so it takes the position of
    the record before it in its partition (its delete) and sorts right after it.
    """
    positioned: list[tuple[tuple[int, int, int], Event]] = []
    for topic in log.list_topics():
        if not topic.startswith(f"{source}.") or is_quarantine_topic(topic):
            continue
        for records in topic_records(log, topic).values():
            position = (0, 0, 0)
            for record in records:
                key = orjson.loads(record.key) if record.key is not None else None
                if record.value is None:
                    position = (position[0], position[1], 1)
                    positioned.append((position, Event(topic, key, None)))
                    continue
                value = orjson.loads(record.value)
                position = (value["source"]["commit_lsn"], value["source"]["txn_index"], 0)
                positioned.append((position, Event(topic, key, value)))
    positioned.sort(key=lambda item: item[0])
    return [event for _, event in positioned]


def compare(
    mode: str, debezium: Sequence[Event], headwater: Sequence[Event], rules: Sequence[Deliberate]
) -> Comparison:
    """Pair the two tools' events topic by topic and classify every difference with ``rules``."""
    result = Comparison(mode, debezium_events=len(debezium), headwater_events=len(headwater))
    by_topic: dict[str, tuple[list[Event], list[Event]]] = defaultdict(lambda: ([], []))
    for event in debezium:
        by_topic[event.topic][0].append(event)
    for event in headwater:
        by_topic[event.topic][1].append(event)
    found: list[Difference] = []
    for topic in sorted(by_topic):
        ours, theirs = by_topic[topic][1], by_topic[topic][0]
        for dbz, hw in _pairs(mode, topic, theirs, ours, found):
            result.pairs += 1
            result.compared[(topic, dbz.op)] += 1
            found.extend(_field_differences(mode, dbz, hw))
    for difference in found:
        rule = next((r for r in rules if r.covers(difference)), None)
        result.differences.append((difference, rule))
    return result


def _pairs(
    mode: str, topic: str, debezium: list[Event], headwater: list[Event], unpaired: list[Difference]
) -> list[tuple[Event, Event]]:
    pairs: list[tuple[Event, Event]] = []
    dbz_rows = {e.identity(): e for e in debezium if e.snapshot}
    hw_rows = {e.identity(): e for e in headwater if e.snapshot}
    for identity in sorted(dbz_rows.keys() | hw_rows.keys()):
        dbz, hw = dbz_rows.get(identity), hw_rows.get(identity)
        if dbz is not None and hw is not None:
            pairs.append((dbz, hw))
        else:
            unpaired.append(_only(mode, topic, dbz, hw))
    dbz_stream = [e for e in debezium if not e.snapshot]
    hw_stream = [e for e in headwater if not e.snapshot]
    matcher = difflib.SequenceMatcher(
        None, [e.signature() for e in dbz_stream], [e.signature() for e in hw_stream], autojunk=False
    )
    for tag, d1, d2, h1, h2 in matcher.get_opcodes():
        if tag == "equal":
            pairs.extend(zip(dbz_stream[d1:d2], hw_stream[h1:h2], strict=True))
            continue
        unpaired.extend(_only(mode, topic, e, None) for e in dbz_stream[d1:d2])
        unpaired.extend(_only(mode, topic, None, e) for e in hw_stream[h1:h2])
    return pairs


def _only(mode: str, topic: str, debezium: Event | None, headwater: Event | None) -> Difference:
    event = debezium or headwater
    assert event is not None
    shown = {"key": event.key, "value": event.value}
    return Difference(
        mode,
        topic,
        event.op,
        "event",
        shown if debezium is not None else MISSING,
        shown if headwater is not None else MISSING,
    )


def _field_differences(mode: str, debezium: Event, headwater: Event) -> list[Difference]:
    ours = _flatten({"key": headwater.key, "value": headwater.value})
    theirs = _flatten({"key": debezium.key, "value": debezium.value})
    out = []
    for path in sorted(ours.keys() | theirs.keys()):
        dbz, hw = theirs.get(path, MISSING), ours.get(path, MISSING)
        if path in _PROCESSING_TIME or (path in _SOURCE_TIME and debezium.snapshot):
            same = (dbz is MISSING) == (hw is MISSING)
        else:
            same = type(dbz) is type(hw) and dbz == hw
        if not same:
            out.append(Difference(mode, debezium.topic, debezium.op, path, dbz, hw))
    return out


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _short(value: Any, limit: int = 90) -> str:
    text = repr(value) if value is MISSING else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def summary(comparisons: Sequence[Comparison]) -> str:
    """Events compared per mode, then the differences grouped by (rule or UNEXPECTED, path) with an example."""
    lines = ["Debezium conformance:"]
    for c in comparisons:
        lines.append(
            f"  mode {c.mode}: {c.pairs} event pairs compared "
            f"(debezium {c.debezium_events} records, headwater {c.headwater_events}); "
            f"{len(c.differences)} differences, {len(c.unexpected)} unexpected"
        )
    groups: dict[tuple[str, str], list[Difference]] = defaultdict(list)
    reasons: dict[str, str] = {}
    for c in comparisons:
        for difference, rule in c.differences:
            name = rule.name if rule is not None else "UNEXPECTED"
            if rule is not None:
                reasons[name] = rule.reason
            groups[(name, difference.path)].append(difference)
    for name in sorted({n for n, _ in groups}, key=lambda n: (n != "UNEXPECTED", n)):
        paths = sorted(p for n, p in groups if n == name)
        count = sum(len(groups[(name, p)]) for p in paths)
        lines.append(f"  [{name}] {count} differences" + (f": {reasons[name]}" if name in reasons else ""))
        for path in paths:
            found = groups[(name, path)]
            modes = sorted({d.mode for d in found})
            where = "every mode" if len(modes) == len(comparisons) > 1 else ", ".join(modes)
            lines.append(f"    {path} x{len(found)} ({where}), e.g. {found[0].example()}")
    return "\n".join(lines)
