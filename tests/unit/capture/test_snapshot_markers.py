"""Snapshot markers: a chunk's COPY blocks split so the table's first and last rows carry Debezium's markers."""

from __future__ import annotations

import pytest

from capture.postgres.snapshot.copy_text import CopyRows
from capture.postgres.snapshot.reader import MarkedRows
from log.envelope import SnapshotMarker as M


def lines(*ids: int) -> CopyRows:
    return CopyRows(b"".join(b"%d\tv%d\n" % (i, i) for i in ids))


def marked(blocks: list[CopyRows], **flags: bool) -> list[tuple[list[str], M]]:
    rows = MarkedRows(blocks, **flags)
    return [([row[0] for row in part], marker) for part, marker in rows]  # type: ignore[misc]


ONLY_TABLE = {"first_table": True, "last_table": True}


def test_one_table_in_one_chunk_over_several_blocks() -> None:
    out = marked([lines(1, 2), CopyRows(b""), lines(3, 4, 5)], first_in_table=True, last_chunk=True, **ONLY_TABLE)
    assert out == [(["1"], M.FIRST), (["2"], M.TRUE), (["3", "4"], M.TRUE), (["5"], M.LAST)]


def test_split_rows_stay_copy_text_for_the_native_pass() -> None:
    parts = list(MarkedRows([lines(1, 2, 3)], first_in_table=True, last_chunk=True, **ONLY_TABLE))
    assert all(isinstance(part, CopyRows) for part, _marker in parts)
    assert b"".join(part.data for part, _marker in parts) == lines(1, 2, 3).data  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("first_table", "last_table", "marker"),
    [(True, True, M.LAST), (True, False, M.FIRST), (False, True, M.LAST), (False, False, M.LAST_IN_DATA_COLLECTION)],
)
def test_a_single_row_table(first_table: bool, last_table: bool, marker: M) -> None:
    out = marked([lines(7)], first_in_table=True, last_chunk=True, first_table=first_table, last_table=last_table)
    assert out == [(["7"], marker)]


def test_a_table_between_others_over_chunks() -> None:
    between = {"first_table": False, "last_table": False}
    first_chunk = marked([lines(1, 2)], first_in_table=True, last_chunk=False, **between)
    middle_chunk = marked([lines(3)], first_in_table=False, last_chunk=False, **between)
    last_chunk = marked([lines(4, 5)], first_in_table=False, last_chunk=True, **between)
    assert first_chunk == [(["1"], M.FIRST_IN_DATA_COLLECTION), (["2"], M.TRUE)]
    assert middle_chunk == [(["3"], M.TRUE)]
    assert last_chunk == [(["4"], M.TRUE), (["5"], M.LAST_IN_DATA_COLLECTION)]


def test_empty_chunks_and_tables_emit_nothing() -> None:
    rows = MarkedRows([CopyRows(b"")], first_in_table=True, last_chunk=True, **ONLY_TABLE)
    assert list(rows) == []
    assert not rows.emitted


def test_parsed_rows_split_as_rows() -> None:
    # Rows that are not plain COPY lines (here: parsed tuples) are split as a sequence.
    blocks = [[("1", "a"), ("2", "b"), ("3", "c")]]
    out = [
        (list(part), marker) for part, marker in MarkedRows(blocks, first_in_table=True, last_chunk=True, **ONLY_TABLE)
    ]
    assert out == [([("1", "a")], M.FIRST), ([("2", "b")], M.TRUE), ([("3", "c")], M.LAST)]
