"""SCD2 across a schema change: a re-read that finds a row unchanged writes no version; a changed row starts at the DDL.

Rows are (userId, name, city, op, sequenceNum) as in the AUTO CDC examples; ``r`` is a
re-read (an incremental snapshot after a schema change), the DDL's position is ``seq(10)``.
"""

from __future__ import annotations

from harness.auto_cdc_examples import KEYS, changes, scd2_table, seq

from warehouse_loader.scd2 import Scd2State, apply_scd2, plan_scd2

DDL = 10


def run(batches: list[list[tuple]], points: tuple[int, ...] = (DDL,)) -> list[tuple]:
    state: Scd2State | None = None
    for rows in batches:
        batch = changes(rows)
        if state is None:
            actions = plan_scd2(batch, KEYS, reread_points=[seq(p) for p in points])
            state = apply_scd2(
                Scd2State(rows=actions.versions.slice(0, 0), tombstones=actions.tombstones.slice(0, 0)), actions, KEYS
            )
            continue
        actions = plan_scd2(
            batch,
            KEYS,
            state.rows,
            tombstones=state.tombstones,
            truncates=state.truncates,
            reread_points=[seq(p) for p in points],
        )
        state = apply_scd2(state, actions, KEYS)
    assert state is not None
    return scd2_table(state.rows)


def test_a_re_read_that_finds_a_row_unchanged_writes_no_version() -> None:
    history = run([[(1, "Ann", "Oslo", "INSERT", 1)], [(1, "Ann", "Oslo", "r", 12)]])
    assert history == [(1, "Ann", "Oslo", 1, None)]


def test_a_re_read_that_finds_a_row_changed_starts_its_version_at_the_ddl() -> None:
    history = run([[(1, "Ann", "Oslo", "INSERT", 1)], [(1, "Ann", "Bergen", "r", 12)]])
    assert history == [(1, "Ann", "Oslo", 1, DDL), (1, "Ann", "Bergen", DDL, None)]


def test_a_change_after_the_ddl_keeps_its_own_position_and_the_re_read_folds_into_it() -> None:
    history = run(
        [[(1, "Ann", "Oslo", "INSERT", 1)], [(1, "Ann", "Bergen", "UPDATE", 11)], [(1, "Ann", "Bergen", "r", 12)]]
    )
    assert history == [(1, "Ann", "Oslo", 1, 11), (1, "Ann", "Bergen", 11, None)]


def test_the_same_history_in_one_batch_and_after_replanning() -> None:
    rows = [
        (1, "Ann", "Oslo", "INSERT", 1),
        (2, "Bo", "Rome", "INSERT", 2),
        (1, "Ann", "Bergen", "r", 12),
        (2, "Bo", "Rome", "r", 12),
        (1, "Ann", "Turku", "UPDATE", 14),
    ]
    one = run([rows])
    several = run([[r] for r in rows])
    assert (
        one
        == several
        == [
            (1, "Ann", "Oslo", 1, DDL),
            (1, "Ann", "Bergen", DDL, 14),
            (1, "Ann", "Turku", 14, None),
            (2, "Bo", "Rome", 2, None),
        ]
    )


def test_without_a_ddl_before_it_a_changed_re_read_is_a_version_at_its_own_position() -> None:
    history = run([[(1, "Ann", "Oslo", "INSERT", 11)], [(1, "Ann", "Bergen", "r", 12)]])
    assert history == [(1, "Ann", "Oslo", 11, 12), (1, "Ann", "Bergen", 12, None)]


def test_a_re_read_after_a_delete_opens_a_version() -> None:
    history = run([[(1, "Ann", "Oslo", "INSERT", 1), (1, None, None, "DELETE", 2)], [(1, "Ann", "Oslo", "r", 12)]])
    assert history == [(1, "Ann", "Oslo", 1, 2), (1, "Ann", "Oslo", 12, None)]


def test_a_re_read_without_a_dropped_column_keeps_its_values_and_opens_no_version() -> None:
    first = changes([(1, "Ann", "Oslo", "INSERT", 1)])
    reread = changes([(1, "Ann", None, "r", 12)]).drop_columns(["city"])  # city was dropped from the source
    state = None
    for batch in (first, reread):
        if state is None:
            actions = plan_scd2(batch, KEYS, reread_points=[seq(DDL)])
            state = apply_scd2(
                Scd2State(rows=actions.versions.slice(0, 0), tombstones=actions.tombstones.slice(0, 0)), actions, KEYS
            )
            continue
        actions = plan_scd2(batch, KEYS, state.rows, tombstones=state.tombstones, reread_points=[seq(DDL)])
        state = apply_scd2(state, actions, KEYS)
    assert scd2_table(state.rows) == [(1, "Ann", "Oslo", 1, None)]
