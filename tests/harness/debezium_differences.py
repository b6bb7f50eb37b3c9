"""The allow-list of the Debezium conformance suite: every way Headwater's events may differ from
Debezium 3.6.3's, each with the reason. Anything else that differs fails the suite.

These are choices Headwater keeps; README ("Debezium compatibility") lists them for users.
"""

from __future__ import annotations

import struct
from typing import Any

from harness.conformance_workload import REPLICA_IDENTITY_FULL
from harness.event_comparison import MISSING, Deliberate, Difference

UNAVAILABLE = "__debezium_unavailable_value"
#: What Headwater writes for date 'infinity' / '-infinity' (capture/postgres/types/typemap.py), and for 0001-01-01 BC.
_DATE_SPECIALS = {2**31 - 1, -(2**31), -719528}


#: The class Debezium 3.6.3 names a logical message's data collection by (``<class>@<identity hash>``).
_MESSAGE_ID = "io.debezium.connector.postgresql.LogicalDecodingMessageMonitor$LogicalDecodingMessageId"


def _collection_counts(entries: list[Any]) -> dict[str, int]:
    """An END record's ``data_collections`` as name -> events, Debezium's message entries summed as 'message'."""
    counts: dict[str, int] = {}
    for entry in entries:
        name = entry["data_collection"]
        name = "message" if name.startswith(_MESSAGE_ID + "@") else name
        counts[name] = counts.get(name, 0) + entry["event_count"]
    return counts


#: The workload's table whose precise-mode rows Headwater quarantines.
_QUARANTINED = "public.numeric_special"


def _no_event_written(d: Difference) -> bool:
    """Debezium's BEGIN, or its END of a transaction with no events or only quarantined ones."""
    value = d.debezium["value"]
    if value["status"] == "BEGIN":
        return True  # its END (checked here too) says why
    collections = {c["data_collection"] for c in value["data_collections"]}
    return value["event_count"] == 0 or (d.mode.startswith("precise") and collections == {_QUARANTINED})


def _fewer_for_quarantine(d: Difference) -> bool:
    """An END's counts lower on Headwater's side only by quarantined rows."""
    if d.path == "value.event_count":
        return isinstance(d.debezium, int) and isinstance(d.headwater, int) and d.debezium > d.headwater
    theirs, ours = _collection_counts(d.debezium), _collection_counts(d.headwater)
    return theirs.keys() == ours.keys() and all(
        theirs[name] == ours[name] or (name == _QUARANTINED and theirs[name] > ours[name]) for name in theirs
    )


def _snapshot(d: Difference) -> bool:
    return d.op == "r"


def _same_float32(d: Difference) -> bool:
    numbers = (int, float)
    if not (isinstance(d.debezium, numbers) and isinstance(d.headwater, numbers)):
        return False
    return struct.pack("<f", d.debezium) == struct.pack("<f", d.headwater)


def _nested_array_flattened(d: Difference) -> bool:
    theirs: Any = d.debezium
    ours: Any = d.headwater
    return (
        isinstance(theirs, list)
        and all(item is None for item in theirs)
        and isinstance(ours, list)
        and all(isinstance(item, list) for item in ours)
    )


DELIBERATE: tuple[Deliberate, ...] = (
    Deliberate(
        "source.version names Headwater",
        "source.version says which program wrote the event ('headwater-0.1'), not a Debezium release",
        ("value.source.version",),
    ),
    Deliberate(
        "source.commit_lsn and source.txn_index",
        "Headwater's extra source fields: the event's place in the source's total order (commit LSN, "
        "position in the transaction), what every consumer of the log sequences by",
        ("value.source.commit_lsn", "value.source.txn_index"),
        lambda d: d.debezium is MISSING,
    ),
    Deliberate(
        "streamed source.snapshot is 'false'",
        "Debezium leaves source.snapshot unset on streamed events; its JSON converter prints the field's "
        "default 'false' only with converter.replace.null.with.default=true (the suite runs it with false, "
        "so NULL columns stay null). Headwater always writes 'false', what Debezium's default setup prints",
        ("value.source.snapshot",),
        lambda d: not _snapshot(d) and d.debezium is None and d.headwater == "false",
    ),
    Deliberate(
        "snapshot rows carry each tool's own snapshot position",
        "snapshot rows name the consistent point of the tool's own slot (source.lsn, sequence) and "
        "Debezium's snapshot transaction id (it calls txid_current(), which assigns one; Headwater's "
        "read-only snapshot has none: txId null)",
        ("value.source.lsn", "value.source.sequence", "value.source.txId"),
        _snapshot,
    ),
    Deliberate(
        "transaction.id is xid:commit LSN",
        "Debezium builds transaction.id from the xid and the LSN of each event, so one transaction's "
        "events carry different ids, and its BEGIN and END records too (BEGIN: the first event's LSN, END: "
        "the LSN after the commit); Headwater's is '<xid>:<commit LSN>' for every event of the transaction "
        "and for its BEGIN and END (key and value), so events join their boundaries by id",
        ("value.transaction.id", "key.id", "value.id"),
        lambda d: (
            (d.path == "value.transaction.id" or d.topic.endswith(".transaction"))
            and isinstance(d.debezium, str)
            and isinstance(d.headwater, str)
            and d.debezium.split(":")[0] == d.headwater.split(":")[0]
        ),
    ),
    Deliberate(
        "logical messages are one data collection, 'message'",
        "in an END record's data_collections Debezium names each transactional logical message by a Java "
        f"object's identity ('{_MESSAGE_ID}@440448a0', a new one per message, so each message is its own "
        "entry, and every message's data_collection_order is 1) and lists the entries in hash-map order; "
        "Headwater counts the transaction's messages under 'message' (the data_collection of "
        "<source>.message: a second message's data_collection_order is 2) and lists entries in the order "
        "they first occur. The same tables with the same counts",
        ("value.data_collections", "value.transaction.data_collection_order"),
        lambda d: (
            (
                d.op == "END"
                and isinstance(d.debezium, list)
                and isinstance(d.headwater, list)
                and _collection_counts(d.debezium) == _collection_counts(d.headwater)
            )
            or (d.op == "m" and d.debezium == 1 and isinstance(d.headwater, int) and d.headwater > 1)
        ),
    ),
    Deliberate(
        "a delete's before under REPLICA IDENTITY DEFAULT: columns not sent are null",
        "pgoutput sends only the key of a deleted row (the other columns as NULL); both list every column, "
        "but Debezium fills NOT NULL ones with the column default or a zero value ('', 0, false: Kafka "
        "Connect's required fields cannot be null), Headwater writes null: the value is not known, and a "
        "made-up one would read as data",
        ("value.before.*",),
        lambda d: (
            d.op == "d"
            and d.headwater is None
            and d.debezium is not None
            and not d.topic.endswith(tuple("." + t.split(".")[1] for t in REPLICA_IDENTITY_FULL))
        ),
    ),
    Deliberate(
        "unchanged TOAST holds the real value",
        "an unchanged TOASTed column is filled with its value (from the old row or the key's previous image), "
        f"never Debezium's placeholder {UNAVAILABLE!r}",
        ("value.after.*",),
        lambda d: d.debezium == UNAVAILABLE and d.headwater not in (MISSING, None, UNAVAILABLE),
    ),
    Deliberate(
        "numeric NaN and Infinity in precise mode go to quarantine",
        "decimal.handling.mode=precise cannot express NaN/+-Infinity: Debezium logs an error and writes "
        "the column as null (the value is lost, the row looks real); Headwater sends the record to "
        "<topic>.quarantine with the reason (the suite checks the quarantine holds exactly these)",
        ("event",),
        lambda d: d.mode.startswith("precise") and d.topic.endswith(".numeric_special") and d.headwater is MISSING,
    ),
    Deliberate(
        "no BEGIN/END for a transaction that wrote no event",
        "Headwater writes BEGIN/END only for a transaction with events in the log; Debezium also writes "
        "them for an empty transaction (PostgreSQL 14's pgoutput sends those; 15+ skips them) and for one "
        "whose every change Headwater quarantined (precise-mode NaN/Infinity, see above)",
        ("event",),
        lambda d: d.topic.endswith(".transaction") and d.headwater is MISSING and _no_event_written(d),
    ),
    Deliberate(
        "END counts the events written, not those quarantined",
        "the precise-mode NaN/Infinity rows Debezium writes with a null column are quarantined by Headwater "
        "(see above), so its END records count only the events written to table topics: a consumer "
        "waiting for event_count events finds them all",
        ("value.event_count", "value.data_collections"),
        lambda d: d.mode.startswith("precise") and d.topic.endswith(".transaction") and _fewer_for_quarantine(d),
    ),
    Deliberate(
        "date infinity and BC dates",
        "date 'infinity'/'-infinity' are 2147483647/-2147483648 days (Debezium prints different garbage in "
        "its snapshot and its stream); '0001-01-01 BC' is -719528 days, proleptic Gregorian like PostgreSQL "
        "(Debezium drops the era: -719162, 0001-01-01 AD)",
        ("value.after.c_date", "value.before.c_date"),
        lambda d: d.headwater in _DATE_SPECIALS,
    ),
    Deliberate(
        "multidimensional arrays kept",
        "a 2-D array is a list of lists; Debezium's pgoutput decoder turns each inner array into null",
        ("value.after.*", "value.before.*"),
        _nested_array_flattened,
    ),
    Deliberate(
        "float4 printed in shortest form",
        "the same float32 value: Headwater prints PostgreSQL's shortest round-trip text (1e-45), "
        "Java's Float.toString prints 1.4E-45",
        ("value.after.*", "value.before.*"),
        _same_float32,
    ),
)
