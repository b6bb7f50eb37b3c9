"""Golden tests of every AUTO CDC option through the Delta writer on a temp dir (no service).

Cases from two public references (cases, not code):

* Databricks, "AUTO CDC ... Example: SCD type 1 and SCD type 2 processing with CDF source
  data" (https://docs.databricks.com/aws/en/ldp/cdc): a change feed with ``operation`` and
  ``sequenceNum`` columns, ``apply_as_deletes = operation = 'DELETE'``,
  ``except_column_list = [operation]``, ``track_history_except_column_list = [city]``,
  the truncate variant.
* Apache Spark's AUTO CDC suites (``sql/pipelines`` ``AutoCdcOutOfOrderConvergenceSuite``,
  ``Scd2CoalesceIgnoredNullsSuite``, ``ChangeArgsSuite``): a random stream of upserts,
  deletes (by a delete flag excluded from the target) and duplicates, with nulls, fed as
  one sorted batch and as shuffled batches, must give the same table; ignored nulls
  inherit the latest earlier value, a delete resets inheritance, a late authored value
  replaces an inherited one; column lists naming unknown columns are refused.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from harness.auto_cdc_examples import DOC_FEED
from harness.table_formats import TableFormat

from core.config import parse_config
from core.errors import ConfigError
from core.warehouse_config import TableConfig
from log.sequence import Sequence
from warehouse_loader.changes import COMMIT_TS, END_AT, INHERITED, OP, SEQ, START_AT
from warehouse_loader.errors import ChangeBatchError

KEYS = ["userId"]

DOC_SCD1 = [(124, "Raul", "Oaxaca"), (125, "Mercedes", "Guadalajara"), (126, "Lily", "Cancun")]
DOC_SCD2 = [
    (123, "Isabel", "Monterrey", 1, 5),
    (123, "Isabel", "Chihuahua", 5, 6),
    (124, "Raul", "Oaxaca", 1, None),
    (125, "Mercedes", "Tijuana", 2, 5),
    (125, "Mercedes", "Mexicali", 5, 6),
    (125, "Mercedes", "Guadalajara", 6, None),
    (126, "Lily", "Cancun", 2, None),
]
FEED_OPTIONS = {
    "sequence_by": "sequenceNum",
    "apply_as_deletes": "operation = 'DELETE'",
    "except_column_list": ["operation"],
    "apply_as_truncates": False,
}


def table_config(**options: Any) -> TableConfig:
    return TableConfig.model_validate({"from": "users_feed", **options})


def feed(rows: list[tuple[Any, ...]]) -> pa.Table:
    """A change batch as a feed of plain rows delivers it: every record an upsert, the operation a column."""
    return pa.table(
        {
            "userId": pa.array([r[0] for r in rows], pa.int64()),
            "name": pa.array([r[1] for r in rows], pa.string()),
            "city": pa.array([r[2] for r in rows], pa.string()),
            "operation": pa.array([r[3] for r in rows], pa.string()),
            "sequenceNum": pa.array([r[4] for r in rows], pa.int64()),
            OP: pa.array(["c"] * len(rows), pa.string()),
            COMMIT_TS: pa.array([0] * len(rows), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        }
    )


def log_changes(rows: list[tuple[Any, ...]]) -> pa.Table:
    """A change batch as the log delivers it: op codes, the source sequence (``n`` -> LSN n)."""
    ops = {"INSERT": "c", "UPDATE": "u", "DELETE": "d", "TRUNCATE": "t"}
    return pa.table(
        {
            "userId": pa.array([r[0] for r in rows], pa.int64()),
            "name": pa.array([r[1] for r in rows], pa.string()),
            "city": pa.array([r[2] for r in rows], pa.string()),
            SEQ: pa.array([Sequence(r[4], 0).sortable() for r in rows], pa.string()),
            OP: pa.array([ops[r[3]] for r in rows], pa.string()),
            COMMIT_TS: pa.array([0] * len(rows), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        }
    )


def load(fmt: TableFormat, path: Path, config: TableConfig, batches: list[pa.Table]) -> pa.Table:
    """Write ``batches`` in order to the table at ``path`` in format ``fmt``; its rows after the last."""
    where = fmt.where(path)
    for batch_id, batch in enumerate(batches):
        fmt.write_batch(where, batch, table="users", batch_id=batch_id, keys=KEYS, config=config)
    return fmt.rows(where)


def current(rows: pa.Table) -> list[tuple[Any, ...]]:
    return sorted((r["userId"], r["name"], r["city"]) for r in rows.to_pylist())


def seq_number(value: Any) -> Any:
    return Sequence.from_sortable(value).commit_lsn if isinstance(value, str) else value


def versions(rows: pa.Table) -> list[tuple[Any, ...]]:
    out = [
        (r["userId"], r["name"], r["city"], seq_number(r[START_AT]), seq_number(r[END_AT])) for r in rows.to_pylist()
    ]
    return sorted(out, key=lambda v: (v[0], v[3]))


def shuffled_batches(rows: list[tuple[Any, ...]], make: Any, seed: int, count: int = 3) -> list[pa.Table]:
    order = list(rows)
    random.Random(seed).shuffle(order)
    size = -(-len(order) // count)
    return [make(order[i : i + size]) for i in range(0, len(order), size)]


# ------------------------------------------------------------------ the documentation's example


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_doc_feed_scd1_soft_deletes_custom_sequence_excluded_column(
    table_format: TableFormat, tmp_path: Path, seed: int | None
) -> None:
    batches = [feed(DOC_FEED)] if seed is None else shuffled_batches(DOC_FEED, feed, seed)
    rows = load(table_format, tmp_path / "t", table_config(**FEED_OPTIONS), batches)
    assert current(rows) == DOC_SCD1
    assert "operation" not in rows.column_names  # except_column_list
    assert "sequenceNum" in rows.column_names  # the sequence is always kept: the MERGE compares it


@pytest.mark.parametrize("seed", [None, 4, 5])
def test_doc_feed_scd2_out_of_order(table_format: TableFormat, tmp_path: Path, seed: int | None) -> None:
    batches = [feed(DOC_FEED)] if seed is None else shuffled_batches(DOC_FEED, feed, seed)
    rows = load(table_format, tmp_path / "t", table_config(mode="scd2", **FEED_OPTIONS), batches)
    assert versions(rows) == DOC_SCD2
    assert rows.schema.field(START_AT).type == pa.int64()  # __START_AT/__END_AT take sequence_by's type


@pytest.mark.parametrize("option", ["track_history_except_column_list", "track_history_columns"])
def test_doc_feed_scd2_history_not_tracked_on_city(table_format: TableFormat, tmp_path: Path, option: str) -> None:
    listed = ["city"] if option == "track_history_except_column_list" else ["name"]
    rows = load(
        table_format, tmp_path / "t", table_config(mode="scd2", **FEED_OPTIONS, **{option: listed}), [feed(DOC_FEED)]
    )
    assert versions(rows) == [
        (123, "Isabel", "Chihuahua", 1, 6),
        (124, "Raul", "Oaxaca", 1, None),
        (125, "Mercedes", "Guadalajara", 2, None),
        (126, "Lily", "Cancun", 2, None),
    ]


def test_doc_truncate_scd1_and_truncates_off(table_format: TableFormat, tmp_path: Path) -> None:
    truncated = [*DOC_FEED[:4], (None, None, None, "TRUNCATE", 3), *DOC_FEED[4:]]
    assert current(load(table_format, tmp_path / "on", table_config(), [log_changes(truncated)])) == [
        (125, "Mercedes", "Guadalajara")
    ]
    off = load(table_format, tmp_path / "off", table_config(apply_as_truncates=False), [log_changes(truncated)])
    assert current(off) == DOC_SCD1


# ------------------------------------------------------------------ late deletes, re-inserts


def test_late_delete_older_than_the_row_is_stale_newer_one_holds(table_format: TableFormat, tmp_path: Path) -> None:
    config = table_config()
    rows = load(
        table_format,
        tmp_path / "a",
        config,
        [
            log_changes([(1, "a", "x", "INSERT", 1), (1, "b", "x", "UPDATE", 3)]),
            log_changes([(1, None, None, "DELETE", 2)]),
        ],
    )
    assert current(rows) == [(1, "b", "x")]
    rows = load(
        table_format,
        tmp_path / "b",
        config,
        [
            log_changes([(1, "a", "x", "INSERT", 1), (1, None, None, "DELETE", 4)]),
            log_changes([(1, "b", "x", "UPDATE", 3)]),
        ],
    )
    assert current(rows) == []


def test_late_delete_splits_scd2_history(table_format: TableFormat, tmp_path: Path) -> None:
    rows = load(
        table_format,
        tmp_path / "t",
        table_config(mode="scd2"),
        [
            log_changes([(1, "a", "x", "INSERT", 1), (1, "c", "x", "UPDATE", 5)]),
            log_changes([(1, None, None, "DELETE", 3)]),
        ],
    )
    assert versions(rows) == [(1, "a", "x", 1, 3), (1, "c", "x", 5, None)]


@pytest.mark.parametrize("mode", ["scd1", "scd2"])
@pytest.mark.parametrize("seed", [None, 7, 8])
def test_delete_then_reinsert(table_format: TableFormat, tmp_path: Path, mode: str, seed: int | None) -> None:
    stream = [(1, "a", "x", "INSERT", 1), (1, None, None, "DELETE", 2), (1, "b", "y", "INSERT", 3)]
    batches = [log_changes(stream)] if seed is None else shuffled_batches(stream, log_changes, seed)
    rows = load(table_format, tmp_path / "t", table_config(mode=mode), batches)
    if mode == "scd1":
        assert current(rows) == [(1, "b", "y")]
    else:
        assert versions(rows) == [(1, "a", "x", 1, 2), (1, "b", "y", 3, None)]


# ------------------------------------------------------------------ ignore-null updates


@pytest.mark.parametrize("mode", ["scd1", "scd2"])
def test_ignore_null_updates_keep_values(table_format: TableFormat, tmp_path: Path, mode: str) -> None:
    stream = [(1, "a", "x", "INSERT", 1), (1, None, "y", "UPDATE", 2), (1, None, None, "UPDATE", 3)]
    rows = load(
        table_format, tmp_path / "all", table_config(mode=mode, ignore_null_updates=True), [log_changes(stream)]
    )
    only_name = load(
        table_format,
        tmp_path / "name",
        table_config(mode=mode, ignore_null_updates_column_list=["name"]),
        [log_changes(stream)],
    )
    all_but_city = load(
        table_format,
        tmp_path / "except",
        table_config(mode=mode, ignore_null_updates_except_column_list=["city"]),
        [log_changes(stream)],
    )
    if mode == "scd1":
        assert current(rows) == [(1, "a", "y")]
        assert current(only_name) == current(all_but_city) == [(1, "a", None)]  # city's null is applied
    else:
        assert versions(rows) == [(1, "a", "x", 1, 2), (1, "a", "y", 2, 3), (1, "a", "y", 3, None)]
        assert versions(only_name) == [(1, "a", "x", 1, 2), (1, "a", "y", 2, 3), (1, "a", None, 3, None)]


@pytest.mark.parametrize("mode", ["scd1", "scd2"])
def test_late_authored_value_replaces_an_inherited_one(table_format: TableFormat, tmp_path: Path, mode: str) -> None:
    # Spark: "an authored value restarts inheritance" / late preceding rows replace inherited values.
    first = log_changes([(1, "old", "x", "INSERT", 10), (1, None, "z", "UPDATE", 30)])
    late = log_changes([(1, "new", None, "UPDATE", 20)])
    rows = load(table_format, tmp_path / "t", table_config(mode=mode, ignore_null_updates=True), [first, late])
    if mode == "scd1":
        assert current(rows) == [(1, "new", "z")]
        assert rows.column(INHERITED).to_pylist() == ['{"name":' + f'"{Sequence(20, 0).sortable()}"' + "}"]
    else:
        assert versions(rows) == [(1, "old", "x", 10, 20), (1, "new", "x", 20, 30), (1, "new", "z", 30, None)]


@pytest.mark.parametrize("mode", ["scd1", "scd2"])
def test_a_delete_resets_inheritance(table_format: TableFormat, tmp_path: Path, mode: str) -> None:
    stream = [(1, "a", "x", "INSERT", 1), (1, None, None, "DELETE", 2), (1, None, "y", "INSERT", 3)]
    rows = load(table_format, tmp_path / "t", table_config(mode=mode, ignore_null_updates=True), [log_changes(stream)])
    if mode == "scd1":
        assert current(rows) == [(1, None, "y")]
    else:
        assert versions(rows) == [(1, "a", "x", 1, 2), (1, None, "y", 3, None)]


def random_stream(rng: random.Random) -> list[tuple[Any, ...]]:
    """Spark's convergence case: a few keys, upserts with nulls, 20% deletes, 15% duplicates."""
    stream: list[tuple[Any, ...]] = []
    seq = 1
    for key in range(4):
        for _ in range(rng.randint(1, 12)):
            delete = rng.random() < 0.2
            name = None if delete or rng.random() < 0.3 else rng.choice(["red", "blue", "green"])
            city = None if delete or rng.random() < 0.3 else rng.choice(["x", "y", "z"])
            event = (key, name, city, "DELETE" if delete else "UPDATE", seq)
            seq += 1
            stream.append(event)
            if rng.random() < 0.15:
                stream.append(event)
    return stream


def feed_with_flag(rows: list[tuple[Any, ...]]) -> pa.Table:
    return feed([(k, n, c, op, s) for k, n, c, op, s in rows])


@pytest.mark.parametrize("mode", ["scd1", "scd2"])
@pytest.mark.parametrize("ignore_nulls", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_shuffled_batches_converge_to_the_sorted_batch(
    table_format: TableFormat, tmp_path: Path, mode: str, ignore_nulls: bool, seed: int
) -> None:
    stream = random_stream(random.Random(seed))
    config = table_config(mode=mode, ignore_null_updates=ignore_nulls, **FEED_OPTIONS)
    in_order = load(table_format, tmp_path / "sorted", config, [feed_with_flag(sorted(stream, key=lambda e: e[4]))])
    shuffled = load(
        table_format, tmp_path / "shuffled", config, shuffled_batches(stream, feed_with_flag, seed + 100, count=5)
    )
    view = current if mode == "scd1" else versions
    assert view(shuffled) == view(in_order)


# ------------------------------------------------------------------ column selection, errors


def test_column_list_keeps_keys_sequence_and_the_listed(table_format: TableFormat, tmp_path: Path) -> None:
    rows = load(table_format, tmp_path / "t", table_config(column_list=["name"]), [log_changes(DOC_FEED[:4])])
    assert [n for n in rows.column_names if not n.startswith("__")] == ["userId", "name"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"column_list": ["name", "nope"]}, "column_list names nope, not among the columns name, city"),
        ({"except_column_list": ["userId"]}, "except_column_list names key column"),
        ({"apply_as_deletes": "no_such_column"}, "apply_as_deletes 'no_such_column' cannot be evaluated"),
        ({"mode": "scd2", "track_history_except_column_list": ["zip"]}, "track_history_except_column_list names zip"),
    ],
)
def test_bad_column_names_fail_the_batch_in_one_line(
    table_format: TableFormat, tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ChangeBatchError, match=message) as caught:
        load(table_format, tmp_path / "t", table_config(**options), [log_changes(DOC_FEED[:4])])
    assert "\n" not in str(caught.value)


def test_custom_sequence_needs_it_on_deletes(table_format: TableFormat, tmp_path: Path) -> None:
    batch = log_changes([(1, "a", "x", "INSERT", 1), (1, None, None, "DELETE", 2)])
    batch = batch.append_column("version", pa.array([1, None], pa.int64()))
    with pytest.raises(ChangeBatchError, match="REPLICA IDENTITY FULL"):
        load(table_format, tmp_path / "t", table_config(sequence_by="version", apply_as_truncates=False), [batch])


def test_a_tie_on_a_custom_sequence_goes_to_the_later_change_across_batches(
    table_format: TableFormat, tmp_path: Path
) -> None:
    # Under REPLICA IDENTITY FULL a delete's image carries the row's last sequence value: it ties
    # with the update before it, in a later batch; the source's order says the delete came last.
    def versioned(rows: list[tuple[Any, ...]], version: int) -> pa.Table:
        return log_changes(rows).append_column("version", pa.array([version] * len(rows), pa.int64()))

    config = table_config(sequence_by="version", apply_as_truncates=False)
    first = versioned([(1, "a", "x", "INSERT", 1), (2, "b", "y", "INSERT", 1)], 5)
    later = versioned([(1, None, None, "DELETE", 2), (2, "b2", "y2", "UPDATE", 2)], 5)
    assert current(load(table_format, tmp_path / "t", config, [first, later])) == [(2, "b2", "y2")]


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (
            {"column_list": ["a"], "except_column_list": ["b"]},
            "warehouse.tables.t.except_column_list: cannot be given with column_list; keep one",
        ),
        ({"track_history_columns": ["a"]}, "warehouse.tables.t.track_history_columns: tracks history, so it needs"),
        (
            {"track_history_except_column_list": ["a"]},
            "warehouse.tables.t.track_history_except_column_list: tracks history",
        ),
        (
            {"mode": "scd2", "track_history_columns": ["a"], "track_history_except_column_list": ["b"]},
            "track_history_except_column_list: cannot be given with track_history_columns",
        ),
        (
            {"ignore_null_updates": True, "ignore_null_updates_except_column_list": ["a"]},
            "ignore_null_updates_except_column_list: cannot be given with ignore_null_updates",
        ),
        ({"sequence_by": "ts"}, "warehouse.tables.t.apply_as_truncates: a truncate carries no row"),
        ({"except_column_list": ["a"], "ignore_null_updates_column_list": ["a"]}, "left out of the table"),
        ({"apply_as_deletes": ""}, "warehouse.tables.t.apply_as_deletes: give a SQL boolean expression"),
    ],
)
def test_conflicting_options_fail_config_load_naming_the_field(options: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error.replace(".", r"\.")) as caught:
        parse_config({"project": "p", "warehouse": {"tables": {"t": {"from": "f", **options}}}}, Path("headwater.yaml"))
    assert "\n" not in str(caught.value)
