"""Spill files and spilling transactions: what goes to disk comes back whole, in order, in bounded pieces.

* :class:`capture.spill.SpillFile`: round trip, tags left out, removal, damage found by the CRC.
* :class:`capture.postgres.streaming.transactions.TransactionAssembler` with a spill directory, fed the recorded
  pgoutput session (streamed transactions with a rolled-back subtransaction, a streamed abort,
  DDL, TOAST, messages) as the agent's loop feeds it: every committed transaction's changes,
  read back piece by piece, equal what the assembler without spill gives, whatever the
  threshold and piece size.
* :class:`capture.postgres.events.builder.TransactionBuild` and :class:`capture.transaction_records.BoundaryCount`:
  events and BEGIN/END built piece by piece equal those built at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pgoutput_recordings import recording
from test_events import builder, relation, txn

from capture.postgres.decoding.pgoutput import PgoutputDecoder
from capture.postgres.decoding.pgoutput_messages import Delete, Insert, LogicalMessage, Relation, Update
from capture.postgres.streaming.transactions import Transaction, TransactionAssembler
from capture.records import OutRecord
from capture.spill import SpillBudget, SpillDirectory, SpillFile
from capture.transaction_records import TransactionBoundaries
from log.sequence import Lsn

SOME = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class NeverFull:
    """A FullDisk for files on a disk with room: any call is a failure of the test."""

    def wait(self, error: OSError, directory: Path) -> None:
        raise AssertionError(f"unexpected full disk: {error}")

    def cleared(self) -> None:
        raise AssertionError("unexpected cleared()")


def test_a_spill_file_gives_back_every_change_in_order_one_batch_at_a_time(tmp_path: Path) -> None:
    spill = SpillFile(tmp_path / "t.spill", NeverFull(), batch_bytes=4096)
    added = [(i * 8, i % 3, bytes([i % 251]) * (i % 300)) for i in range(2000)]
    for position, tag, payload in added:
        spill.add(position, tag, payload)
    pieces = list(spill.read())
    assert [tuple(c) for piece in pieces for c in piece] == added
    assert len(pieces) > 10, "a piece is one batch, not the whole file"
    assert all(sum(len(c.payload) + 16 for c in piece) < 4096 + 320 for piece in pieces)
    assert spill.size < sum(len(p) for _, _, p in added), "batches are stored zstd-compressed"
    kept = [c for piece in spill.read(frozenset({1})) for c in piece]
    assert [tuple(c) for c in kept] == [a for a in added if a[1] != 1]
    spill.remove()
    assert not (tmp_path / "t.spill").exists()
    spill.remove()  # idempotent


def test_a_damaged_spill_file_is_refused_not_read(tmp_path: Path) -> None:
    spill = SpillFile(tmp_path / "t.spill", NeverFull(), batch_bytes=1024)
    for i in range(300):
        spill.add(i, 0, b"x%d" % i * 10)
    list(spill.read())  # writes the last batch
    path = tmp_path / "t.spill"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(data)
    with pytest.raises(OSError, match=r"damaged batch|no batch"):
        list(spill.read())


def test_the_budget_spills_growing_transactions_once_the_threshold_is_held() -> None:
    budget = SpillBudget(1600)
    budget.hold(1500)
    assert not budget.should_spill(1500), "under the threshold nothing spills"
    budget.hold(99)
    assert not budget.should_spill(99)
    budget.hold(1)
    assert budget.should_spill(1500), "the large transaction spills"
    assert not budget.should_spill(99), "a transaction under a sixteenth of the threshold stays in memory"
    assert budget.should_spill(100)
    budget.release(1500)
    assert not budget.should_spill(100)


def _assembled(threshold: int | None, piece: int, directory: Path, *, use_raw: bool = True) -> list[tuple]:
    """The recorded v2 session through an assembler as the agent's loop feeds it; each transaction's pieces."""
    spill = None
    if threshold is not None:
        spill = SpillDirectory(directory, NeverFull(), SpillBudget(threshold))
        spill.clear()
    decoder, assembler = PgoutputDecoder(2), TransactionAssembler(spill)
    out: list[tuple] = []
    for at, row in enumerate(recording("pgoutput_v2.jsonl")):
        lsn = 16 * (at + 1)
        if use_raw and assembler.spilling and assembler.spill_raw(row.data, lsn):
            continue
        done = assembler.feed(decoder.decode(row.data), lsn, row.data)
        if isinstance(done, Transaction):
            changes, lsns = [], []
            for part, part_lsns in done.pieces(piece):
                assert 0 < len(part) <= piece
                assert len(part) == len(part_lsns)
                changes.extend(part)
                lsns.extend(part_lsns)
            out.append((done.xid, done.commit_lsn, done.end_lsn, changes, lsns, done.spilled is not None))
            done.release()
    assembler.discard()
    if spill is not None:
        assert list(directory.iterdir()) == [], "no spill file outlives its transaction"
    return out


@SOME
@given(threshold=st.integers(1, 200_000), piece=st.integers(1, 500), use_raw=st.booleans())
def test_spilled_transactions_come_back_equal_whatever_the_threshold_and_piece(
    tmp_path_factory: pytest.TempPathFactory, threshold: int, piece: int, use_raw: bool
) -> None:
    expected = [t[:5] for t in _assembled(None, 10**9, tmp_path_factory.mktemp("none"))]
    got = _assembled(threshold, piece, tmp_path_factory.mktemp("spill"), use_raw=use_raw)
    assert [t[:5] for t in got] == expected


def test_a_small_threshold_spills_the_streamed_transaction_and_its_rolled_back_subtransaction_stays_out(
    tmp_path: Path,
) -> None:
    plain = _assembled(None, 10**9, tmp_path / "none")
    spilled = _assembled(1 << 12, 64, tmp_path / "spill")
    assert any(t[5] for t in spilled), "the recording's streamed transaction spilled"
    assert [t[:5] for t in spilled] == [t[:5] for t in plain]
    largest = max(plain, key=lambda t: len(t[3]))
    assert len(largest[3]) > 500, "the recorded streamed transaction is large"


def _events_in_pieces(t: Transaction, sizes: list[int]) -> tuple[list[OutRecord], list]:
    b = builder()
    building = b.start(t)
    out, schemas = [], []
    at = 0
    for size in [*sizes, len(t.changes)]:
        if at >= len(t.changes):
            break
        records, found = building.add(t.changes[at : at + size], t.lsns[at : at + size])
        out.extend(records)
        schemas.extend(found)
        at += size
    building.finish()
    return out, schemas


def _mixed_changes() -> list:
    rel = relation()
    changes: list = [rel]
    for i in range(60):
        changes.append(Insert(7, (str(i), f"label {i}", "1.5")))
        if i % 7 == 3:
            changes.append(
                Update(7, (str(i), None, None), (str(i + 1000), "moved", "2"), True)
            )  # key change: 3 records
        if i % 11 == 5:
            changes.append(Delete(7, (str(i), None, None), True))
        if i % 13 == 0:
            changes.append(LogicalMessage(True, Lsn(99 + i), "app", b"hello"))
        if i == 30:
            changes.append(relation())  # the same shape again mid-transaction
    return changes


@SOME
@given(sizes=st.lists(st.integers(1, 40), max_size=20))
def test_events_built_in_pieces_equal_the_events_built_at_once(sizes: list[int]) -> None:
    t = txn(_mixed_changes())
    whole = builder().build(t)
    assert _events_in_pieces(t, sizes) == whole


@SOME
@given(sizes=st.lists(st.integers(1, 40), max_size=20))
def test_begin_and_end_counted_in_pieces_equal_those_counted_at_once(sizes: list[int]) -> None:
    t = txn(_mixed_changes())
    records, _ = builder().build(t)
    whole = TransactionBoundaries("s").records(t, records)
    counting = TransactionBoundaries("s").start(t)
    begins = []
    at = 0
    for size in [*sizes, len(records)]:
        if at >= len(records):
            break
        begin = counting.add(records[at : at + size])
        if begin is not None:
            begins.append(begin)
        at += size
    assert whole is not None
    assert begins == [whole[0]], "one BEGIN, with the first counted event"
    assert counting.end() == whole[1]


def test_relations_are_tagged_so_a_subtransaction_abort_never_drops_them(tmp_path: Path) -> None:
    # The recorded streamed transaction rolls back a subtransaction whose first change came with a
    # Relation message (pgoutput sends it once per streamed transaction): it must stay.
    spilled = _assembled(1, 1, tmp_path)
    relations = [c for t in spilled for c in t[3] if isinstance(c, Relation)]
    plain_relations = [c for t in _assembled(None, 10**9, tmp_path / "none") for c in t[3] if isinstance(c, Relation)]
    assert relations == plain_relations


def test_holding_says_what_the_open_transactions_hold_in_memory_and_on_disk_until_discarded(tmp_path: Path) -> None:
    # What a session logs when it ends with transactions open (a lost connection drops them):
    # the recorded session fed until its streamed transaction spilled, then a few changes more.
    threshold = 1 << 12
    spill = SpillDirectory(tmp_path, NeverFull(), SpillBudget(threshold))
    decoder, assembler = PgoutputDecoder(2), TransactionAssembler(spill)
    assert assembler.holding().transactions == 0
    after_spill = 0
    for at, row in enumerate(recording("pgoutput_v2.jsonl")):
        lsn = 16 * (at + 1)
        if assembler.spilling and assembler.spill_raw(row.data, lsn):
            after_spill += 1
            if after_spill == 50:
                break
            continue
        done = assembler.feed(decoder.decode(row.data), lsn, row.data)
        if isinstance(done, Transaction):
            done.release()
    assert after_spill == 50, "the recording's streamed transaction spilled"
    held = assembler.holding()
    assert held.transactions >= 1
    assert held.spilled_changes >= 50
    assert held.changes > 0
    assert held.estimated_bytes >= threshold, "the budget was reached before the spill began"
    assert held.estimated_bytes == spill.budget.held, "one session's budget counts exactly what its transactions hold"
    assert f"{held.changes} changes in memory" in str(held)
    assert f"{held.spilled_changes} spilled" in str(held)
    assembler.discard()
    assert assembler.holding() == type(held)(0, 0, 0, 0, 0)
    assert list(tmp_path.iterdir()) == []


def _update_message(row: int, xid: int | None) -> bytes:
    """A pgoutput Update of the big-transaction bench's table (bigint key, int, ~40-byte text, timestamptz)."""
    values = (str(row), str(row % 1000), f"a label of about forty bytes, row {row}", "2026-12-02 08:01:23.123456+00")
    tuple_data = b"".join(b"t" + len(v).to_bytes(4, "big") + v.encode() for v in values)
    in_stream = b"" if xid is None else xid.to_bytes(4, "big")
    return b"U" + in_stream + (16384).to_bytes(4, "big") + b"N" + (4).to_bytes(2, "big") + tuple_data


@pytest.mark.parametrize("streamed", [False, True], ids=["open", "streamed"])
def test_the_budget_counts_what_held_changes_take_in_memory(streamed: bool, tmp_path: Path) -> None:
    # The spill budget bounds capture's memory only as well as its estimate of a held change:
    # the estimate is within 10% of what tracemalloc measures, in both ways a change is held.
    import gc
    import tracemalloc

    xid, count = 777, 20_000
    spill = SpillDirectory(tmp_path, NeverFull(), SpillBudget(1 << 40))  # counted, never reached
    decoder, assembler = PgoutputDecoder(2), TransactionAssembler(spill)
    start = b"S" + xid.to_bytes(4, "big") + b"\x01" if streamed else b"B" + bytes(16) + xid.to_bytes(4, "big")
    assembler.feed(decoder.decode(start), 0, start)
    payloads = [_update_message(10_000_000 + i, xid if streamed else None) for i in range(count)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for at, payload in enumerate(payloads):
            assembler.feed(decoder.decode(payload), 1_000_000 + at, payload)
        gc.collect()
        measured = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    estimated = assembler.holding().estimated_bytes
    assert assembler.holding().changes == count
    assert abs(estimated - measured) <= 0.10 * measured, f"estimated {estimated} bytes, {measured} held"
    assembler.discard()
