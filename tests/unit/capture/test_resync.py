"""Resync without services: reconciling deletes from a real file log, the key set, the request file, messages."""

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest.mock import patch

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capture.key_set import KEY_SET_FILE, Candidates, KeySet
from capture.postgres.events.source_block import postgres_source
from capture.postgres.registration.slot import SlotStatus, is_gone, slot_gone_error
from capture.postgres.snapshot.resync import snapshot_keys, vanished_key_deletes
from capture.resync import DELETE_INDEX_BASE, ResyncRequest
from capture.retry_report import RetryReport
from log.base import Record, TopicSpec
from log.envelope import ChangeEvent, Op, encode_value
from log.file.backend import FileLog
from log.partitioner import partition_for
from log.sequence import Lsn

TOPIC = "shop.public.t"


def key(i: int) -> bytes:
    return orjson.dumps({"id": i})


def keys_of(tmp_path, *ids: int, spill_at: int = KeySet.SPILL_AT) -> KeySet:
    """The re-snapshot's key set holding ``ids``; ``spill_at=0``: in the SQLite file."""
    present = KeySet(tmp_path / KEY_SET_FILE, spill_at=spill_at)
    present.add(TOPIC, [key(i) for i in ids])
    return present


def write(log: FileLog, op: Op, i: int | None, lsn: int, *, label: str = "x") -> None:
    source = postgres_source("shop", "db", "public", "t", 7, lsn, lsn, 0, 1_000_000)
    row = {"id": i, "label": label} if i is not None else None
    after = row if op in (Op.CREATE, Op.UPDATE, Op.READ) else None
    before = row if op == Op.DELETE else None
    value = encode_value(ChangeEvent(op=op, source=source, before=before, after=after))
    k = key(i) if i is not None else None
    partition = 0 if k is None else partition_for(k, 2)
    log.append(TOPIC, partition, [Record(k, value)])
    if op == Op.DELETE:
        log.append(TOPIC, partition, [Record(k, None)])


@pytest.fixture
def log(tmp_path):
    file_log = FileLog(tmp_path / "log")
    file_log.create_topic(TopicSpec(TOPIC, partitions=2))
    yield file_log
    file_log.close()


@pytest.mark.parametrize("spill_at", [KeySet.SPILL_AT, 0], ids=["memory", "spilled"])
def test_deletes_for_live_keys_the_source_no_longer_has(log, tmp_path, spill_at):
    write(log, Op.READ, 1, 10)
    write(log, Op.READ, 2, 10)
    write(log, Op.CREATE, 3, 20)
    write(log, Op.DELETE, 2, 30)  # already deleted in the log: no second delete
    write(log, Op.UPDATE, 3, 40, label="latest")
    write(log, Op.CREATE, 4, 50)
    write(log, Op.CREATE, 5, 60)
    present = keys_of(tmp_path, 1, 5, spill_at=spill_at)
    assert present.spilled == (spill_at == 0)
    out = list(vanished_key_deletes(log, TOPIC, present, commit_lsn=100, first_index=DELETE_INDEX_BASE, ts_us=5))
    assert [(r.key, r.value is None) for r in out] == [(key(3), False), (key(3), True), (key(4), False), (key(4), True)]
    assert [(r.commit_lsn, r.txn_index) for r in out] == [
        (100, DELETE_INDEX_BASE),
        (100, DELETE_INDEX_BASE),
        (100, DELETE_INDEX_BASE + 1),
        (100, DELETE_INDEX_BASE + 1),
    ]
    event = orjson.loads(out[0].value)
    assert event["op"] == "d" and event["after"] is None
    assert event["before"] == {"id": 3, "label": "latest"}, "before is the key's last stored image"
    assert (event["source"]["commit_lsn"], event["source"]["txn_index"]) == (100, DELETE_INDEX_BASE)
    assert (event["source"]["table"], event["source"]["snapshot"]) == ("t", "true")


def test_keys_written_before_a_truncate_are_not_live(log, tmp_path):
    write(log, Op.CREATE, 1, 10)
    write(log, Op.TRUNCATE, None, 20)
    write(log, Op.CREATE, 2, 30)
    out = list(vanished_key_deletes(log, TOPIC, keys_of(tmp_path), commit_lsn=100, first_index=0, ts_us=0))
    assert [r.key for r in out if r.value is not None] == [key(2)]


def test_a_topic_never_written_needs_no_deletes(log, tmp_path):
    deletes = vanished_key_deletes(log, "shop.public.other", keys_of(tmp_path), commit_lsn=1, first_index=0, ts_us=0)
    assert list(deletes) == []


def test_resync_request_round_trip_and_clear(tmp_path):
    assert ResyncRequest.load(tmp_path) is None
    request = ResyncRequest.new(tmp_path, "slot dropped", Lsn.parse("0/16B3748"))
    request.save()
    loaded = ResyncRequest.load(tmp_path)
    assert loaded is not None and (loaded.reason, loaded.lost_from, loaded.consistent_lsn) == (
        "slot dropped",
        "0/16B3748",
        None,
    )
    loaded.consistent_lsn = 42
    loaded.save()
    assert ResyncRequest.load(tmp_path).consistent_lsn == 42
    loaded.clear()
    loaded.clear()  # idempotent
    assert ResyncRequest.load(tmp_path) is None


def status(wal_status: str) -> SlotStatus:
    lsn = Lsn.parse("0/3000060")
    return SlotStatus("s", "logical", "pgoutput", "db", False, None, lsn, lsn, 0, wal_status)


def test_gone_slot_messages_say_what_happened_and_what_to_run():
    assert is_gone(None) and is_gone(status("lost")) and not is_gone(status("reserved"))
    dropped = str(slot_gone_error("shop", "headwater_shop", None, Lsn.parse("0/16B3748")))
    assert dropped == (
        'source shop: replication slot "headwater_shop" is gone (dropped; changes since LSN 0/16B3748 cannot be '
        "streamed); run: headwater source resync shop"
    )
    invalidated = str(slot_gone_error("shop", "headwater_shop", status("lost"), None))
    assert (
        "(invalidated: Postgres removed WAL it still needed (max_slot_wal_keep_size); changes since the last run"
        in invalidated
    )
    assert "\n" not in dropped + invalidated


def test_retry_report_logs_state_changes_not_every_attempt(caplog):
    report = RetryReport("shop")
    with caplog.at_level(logging.WARNING, logger="capture.retry_report"):
        report.resumed()  # nothing failed: silent
        for _ in range(5):
            report.failed("connection refused; reconnecting", 5.0)
        report.failed("the database system is starting up", 5.0)
        report.resumed()
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "source shop: connection refused; retrying with backoff (at most 5s apart)"
    assert messages[1].startswith("source shop: the database system is starting up; retrying")
    assert messages[2].startswith("source shop: replication resumed after 6 failed attempts in ")
    assert len(messages) == 3


def in_memory_deletes(log: FileLog, present: set[bytes]) -> list[tuple[bytes, Any]]:
    """The reconcile as it was with every key in a Python set: the reference for the spilled path."""
    latest: dict[bytes, tuple[tuple[int, int], Any]] = {}
    truncated_at = None
    for partition in range(2):
        for record in log.read(TOPIC, partition, 0, max_records=1_000_000):
            if record.value is None:
                if record.key in latest:
                    latest[record.key] = (latest[record.key][0], None)
                continue
            event = orjson.loads(record.value)
            at = (event["source"]["commit_lsn"], event["source"]["txn_index"])
            if event["op"] == "t":
                truncated_at = at if truncated_at is None else max(truncated_at, at)
            elif record.key is not None and record.key not in present:
                latest[record.key] = (at, event if event["op"] != "d" else None)
    return [
        (k, event["after"])
        for k, (at, event) in sorted(latest.items())
        if event is not None and (truncated_at is None or at >= truncated_at)
    ]


class ProtocolOnly:
    """The file log seen only through the ``Log`` protocol (no columnar read), ``read_size`` records a read."""

    def __init__(self, log: FileLog, read_size: int = 10_000) -> None:
        self._log = log
        self._read_size = read_size

    def read(self, topic: str, partition: int, offset: int, *, max_records: int = 10_000, **kw: Any) -> list:
        return self._log.read(topic, partition, offset, max_records=min(max_records, self._read_size), **kw)

    def __getattr__(self, name: str) -> Any:
        if name == "read_columns":
            raise AttributeError(name)
        return getattr(self._log, name)


@contextmanager
def candidates_spilling_at(spill_bytes: int | None) -> Iterator[list[Candidates]]:
    """Candidates move to the scratch file past ``spill_bytes`` (None: the default); yields those that did."""
    spilled: list[Candidates] = []
    spill = Candidates._spill

    def recording(self: Candidates) -> None:
        spilled.append(self)
        spill(self)

    with ExitStack() as stack:
        if spill_bytes is not None:
            stack.enter_context(patch.object(Candidates, "SPILL_BYTES", spill_bytes))
        stack.enter_context(patch.object(Candidates, "_spill", recording))
        yield spilled


history = st.lists(
    st.tuples(st.sampled_from([Op.READ, Op.CREATE, Op.UPDATE, Op.DELETE, Op.TRUNCATE]), st.integers(0, 40)),
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=history, read=st.sets(st.integers(0, 40)), batches=st.integers(1, 4), read_size=st.integers(1, 7))
def test_spilled_key_set_gives_the_deletes_of_the_in_memory_one(tmp_path_factory, events, read, batches, read_size):
    base = tmp_path_factory.mktemp("resync")
    with FileLog(base / "log") as file_log:
        file_log.create_topic(TopicSpec(TOPIC, partitions=2))
        for lsn, (op, i) in enumerate(events, start=1):
            write(file_log, op, None if op == Op.TRUNCATE else i, lsn * 10, label=f"v{lsn}")
        starts = {p: file_log.end_offset(TOPIC, p) for p in range(2)}
        for i in sorted(read):  # the re-snapshot's own records: not read when given their start
            write(file_log, Op.READ, i, 10**5, label="resnapshot")
        expected = in_memory_deletes(file_log, {key(i) for i in read})
        outputs = []
        # Keys in memory, spilled from the start, and spilled midway (after the first of several adds);
        # reading the whole log or only what lies before the re-snapshot's records. "from-log": the keys
        # taken from the re-snapshot's records in the log, as the agent does. The candidates (missing keys'
        # latest live events) held in memory (None: the default threshold), spilled at the first one held
        # (0), or midway (after about two entries), read in batches of read_size records or whole.
        variants = [("memory", 10**6, None, None), ("spilled", 0, None, None), ("midway", 2, starts, None)]
        variants += [("from-log", 0, starts, None), ("from-log-rows", 0, starts, None)]
        variants += [("candidates-spilled", 10**6, None, 0), ("both-midway", 2, starts, 600)]
        variants += [("from-log-rows-spilled", 0, starts, 0)]
        for name, spill_at, end, spill_bytes in variants:
            present = KeySet(base / name / KEY_SET_FILE, spill_at=spill_at)
            reader = ProtocolOnly(file_log, read_size) if name.startswith("from-log-rows") else file_log
            if name.startswith("from-log"):
                # Columnar on the file log; record by record through the Log protocol (the Kafka backend's way).
                snapshot_keys(reader, TOPIC, starts, present)
            else:
                ids = sorted(read)
                for n in range(batches):
                    present.add(TOPIC, [key(i) for i in ids[n::batches]])
            assert present.spilled == (len(read) > spill_at)
            assert present.topics() == [TOPIC]
            with candidates_spilling_at(spill_bytes) as spilled:
                deletes = vanished_key_deletes(
                    reader, TOPIC, present, commit_lsn=10**6, first_index=7, ts_us=1, end=end
                )
                out = list(deletes)
            if spill_bytes == 0 and expected:
                assert spilled, "the candidates did not spill"
            if spill_bytes is None:
                assert not spilled
            present.close()
            deletes = [r for r in out if r.value is not None]
            assert [r.key for r in out if r.value is None] == [r.key for r in deletes], "each delete + tombstone"
            assert [r.txn_index for r in deletes] == list(range(7, 7 + len(deletes)))
            outputs.append([(r.key, orjson.loads(r.value)["before"]) for r in deletes])
    assert outputs == [expected] * len(variants)


@pytest.mark.parametrize("spill_bytes", [Candidates.SPILL_BYTES, 0], ids=["memory", "spilled"])
def test_candidates_keep_only_live_latest_events(tmp_path, spill_bytes):
    with KeySet(tmp_path / KEY_SET_FILE) as present:
        candidates = Candidates(present, spill_bytes=spill_bytes)
        candidates.update({key(1): (10, 0, b"one"), key(2): (10, 1, b"two"), key(3): (10, 2, b"three")})
        candidates.update({key(2): None, key(3): (30, 0, b"three again"), key(4): (40, 0, b"four")})
        assert candidates.spilled == (spill_bytes == 0)
        assert list(candidates.live()) == [(key(1), b"one"), (key(3), b"three again"), (key(4), b"four")]
        assert list(candidates.live((30, 0))) == [(key(3), b"three again"), (key(4), b"four")], "after a truncate"
        early = candidates.live()
        assert next(early) == (key(1), b"one")
        early.close()  # a reader that stops early
        candidates.close()
        assert list(candidates.live()) == []
        if spill_bytes == 0:
            tables = present.database().execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
            assert tables == [], "close() drops the candidates' table"


def test_keys_deleted_in_the_log_are_not_held(tmp_path):
    # Much delete history: a key whose latest event is a delete costs nothing, so 10k created-then-deleted
    # keys never reach a threshold of three entries.
    with KeySet(tmp_path / KEY_SET_FILE) as present:
        candidates = Candidates(present, spill_bytes=3 * (Candidates.ENTRY_OVERHEAD + 20))
        for i in range(10_000):
            candidates.update({key(i): (i, 0, b"row")})
            candidates.update({key(i): None})
        candidates.update({key(1): (10**6, 0, b"back")})
        assert not candidates.spilled and not (tmp_path / KEY_SET_FILE).exists()
        assert list(candidates.live()) == [(key(1), b"back")]


def test_the_key_set_spills_to_the_state_dir_and_goes_with_the_request(tmp_path):
    request = ResyncRequest.new(tmp_path, "slot dropped")
    request.save()
    present = KeySet(tmp_path / KEY_SET_FILE, spill_at=2)
    present.add(TOPIC, [key(1), key(2)])
    assert not present.spilled and not (tmp_path / KEY_SET_FILE).exists()
    present.add("shop.public.empty", [])
    present.add(TOPIC, [key(3), key(2)])
    assert present.spilled and (tmp_path / KEY_SET_FILE).exists()
    assert present.present(TOPIC, [key(i) for i in range(5)]) == {key(1), key(2), key(3)}
    assert present.present("shop.public.empty", [key(1)]) == set()
    assert present.present("shop.public.unknown", [key(1)]) == set()
    assert present.topics() == [TOPIC, "shop.public.empty"]
    present.close()
    assert KeySet(tmp_path / KEY_SET_FILE).present(TOPIC, [key(1)]) == set(), "an interrupted run's keys are gone"
    present = KeySet(tmp_path / KEY_SET_FILE, spill_at=0)
    present.add(TOPIC, [key(1)])
    present.close()
    request.clear()
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "request and key set removed together"
