"""A topic's schema versions as a history: renames placed by position, names now, re-read points."""

from __future__ import annotations

from log.schema_history import Rename, SchemaHistory
from log.sequence import Sequence as Seq


def version(n: int, names: list[str], change: dict | None = None) -> dict:
    record = {"version": n, "columns": [{"name": name} for name in names]}
    if change is not None:
        record["change"] = change
    return record


HISTORY = SchemaHistory.of(
    [
        version(3, ["id", "comment", "note"], {"at": [300, 0], "renamed": {"comment": "remark"}}),
        version(1, ["id", "note"]),
        version(2, ["id", "remark"], {"at": [200, 4], "renamed": {"remark": "note"}, "reread": None}),
        version(4, ["id", "comment"], {"at": [400, 1], "reread": "column 'x' was added with a default"}),
    ]
)


def test_renames_in_order_and_what_an_old_record_calls_a_column_now() -> None:
    assert HISTORY.renames() == (Rename("note", "remark", Seq(200, 4)), Rename("remark", "comment", Seq(300, 0)))
    assert HISTORY.current_name("note", Seq(199, 9)) == "comment"
    assert HISTORY.current_name("remark", Seq(250, 0)) == "comment"
    assert HISTORY.current_name("note", Seq(350, 0)) == "note"  # a column of that name added later


def test_renamed_away_names_exclude_live_ones() -> None:
    assert HISTORY.renamed_away() == frozenset({"note", "remark"})


def test_gone_columns_say_how() -> None:
    assert HISTORY.gone("remark") == ("renamed", "comment")
    assert HISTORY.gone("note") == ("renamed", "comment")
    assert HISTORY.gone("comment") is None
    assert SchemaHistory.of([version(1, ["id", "x"]), version(2, ["id"])]).gone("x") == ("dropped", None)
    assert HISTORY.gone("never") is None


def test_reread_points_and_unplaced_changes() -> None:
    assert HISTORY.reread_points() == (Seq(400, 1),)
    unplaced = SchemaHistory.of(
        [version(1, ["a"]), version(2, ["b"], {"at": None, "renamed": {"b": "a"}, "reread": "x"})]
    )
    assert unplaced.renames() == ()
    assert unplaced.reread_points() == ()
