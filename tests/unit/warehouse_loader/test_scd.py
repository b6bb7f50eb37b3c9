"""SCD1/SCD2 planning against the Databricks AUTO CDC worked example and random change streams.

The example rows and expected tables are copied from "Example: SCD type 1 and SCD type 2
processing with CDF source data" in https://docs.databricks.com/aws/en/ldp/cdc
(``operation``/``sequenceNum`` map to ``__hw_op``/the sequence column).
"""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from harness.auto_cdc_examples import DOC_FEED as DOC_INPUT
from harness.auto_cdc_examples import DOC_TRUNCATE, KEYS, changes, scd2_table, seq
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from log.sequence import Sequence
from warehouse_loader.changes import OP, SEQ, check_changes
from warehouse_loader.errors import ChangeBatchError
from warehouse_loader.scd1 import Scd1State, apply_scd1, empty_tombstones, plan_scd1
from warehouse_loader.scd2 import Scd2State, apply_scd2, plan_scd2


def scd1_table(state: Scd1State) -> list[tuple[Any, ...]]:
    return sorted((r["userId"], r["name"], r["city"]) for r in state.rows.to_pylist())


def empty1(batch: pa.Table) -> Scd1State:
    return Scd1State(rows=batch.slice(0, 0), tombstones=empty_tombstones(batch, KEYS))


def run_scd1(batches: list[pa.Table]) -> Scd1State:
    state = empty1(batches[0])
    for batch in batches:
        actions = plan_scd1(batch, KEYS, tombstones=state.tombstones, truncated_through=state.truncated_through)
        state = apply_scd1(state, actions, KEYS)
    return state


def run_scd2_state(batches: list[pa.Table], tracked: list[str] | None = None) -> Scd2State:
    state: Scd2State | None = None
    for batch in batches:
        if state is None:
            actions = plan_scd2(batch, KEYS, track_history_columns=tracked)
            empty = Scd2State(rows=actions.versions.slice(0, 0), tombstones=actions.tombstones.slice(0, 0))
            state = apply_scd2(empty, actions, KEYS)
            continue
        actions = plan_scd2(
            batch,
            KEYS,
            state.rows,
            tombstones=state.tombstones,
            truncates=state.truncates,
            track_history_columns=tracked,
        )
        state = apply_scd2(state, actions, KEYS)
    assert state is not None
    return state


def run_scd2(batches: list[pa.Table], tracked: list[str] | None = None) -> pa.Table:
    return run_scd2_state(batches, tracked).rows


# ----------------------------------------------------------------------- the documented example


def test_doc_scd1() -> None:
    assert scd1_table(run_scd1([changes(DOC_INPUT)])) == [
        (124, "Raul", "Oaxaca"),
        (125, "Mercedes", "Guadalajara"),
        (126, "Lily", "Cancun"),
    ]


def test_doc_scd1_with_truncate() -> None:
    # "records 124 and 126 are truncated because of the TRUNCATE operation at sequenceNum=3"
    assert scd1_table(run_scd1([changes([*DOC_INPUT, DOC_TRUNCATE])])) == [(125, "Mercedes", "Guadalajara")]


def test_doc_scd2() -> None:
    assert scd2_table(run_scd2([changes(DOC_INPUT)])) == [
        (123, "Isabel", "Monterrey", 1, 5),
        (123, "Isabel", "Chihuahua", 5, 6),
        (124, "Raul", "Oaxaca", 1, None),
        (125, "Mercedes", "Tijuana", 2, 5),
        (125, "Mercedes", "Mexicali", 5, 6),
        (125, "Mercedes", "Guadalajara", 6, None),
        (126, "Lily", "Cancun", 2, None),
    ]


def test_doc_scd2_untracked_city() -> None:
    # Databricks: track_history_except_column_list = ["city"]; here the positive list.
    assert scd2_table(run_scd2([changes(DOC_INPUT)], tracked=["name"])) == [
        (123, "Isabel", "Chihuahua", 1, 6),
        (124, "Raul", "Oaxaca", 1, None),
        (125, "Mercedes", "Guadalajara", 2, None),
        (126, "Lily", "Cancun", 2, None),
    ]


@pytest.mark.parametrize("split", [[8], [4, 2, 2], [1] * 8, [6, 2]])
def test_doc_example_is_independent_of_micro_batching(split: list[int]) -> None:
    batches, start = [], 0
    for size in split:
        batches.append(changes(DOC_INPUT[start : start + size]))
        start += size
    one = [changes(DOC_INPUT)]
    assert scd1_table(run_scd1(batches)) == scd1_table(run_scd1(one))
    assert scd2_table(run_scd2(batches)) == scd2_table(run_scd2(one))
    assert scd2_table(run_scd2(batches, ["name"])) == scd2_table(run_scd2(one, ["name"]))


# ----------------------------------------------------------------------- out of order, duplicates


def test_scd1_late_older_update_does_not_overwrite_newer_row() -> None:
    state = run_scd1([changes([(1, "new", "x", "u", 9)]), changes([(1, "old", "y", "u", 4)])])
    assert scd1_table(state) == [(1, "new", "x")]


def test_scd1_late_update_does_not_resurrect_a_deleted_key() -> None:
    state = run_scd1([changes([(1, "a", "x", "c", 1), (1, None, None, "d", 5)]), changes([(1, "b", "y", "u", 3)])])
    assert scd1_table(state) == []


def test_scd1_late_change_older_than_a_truncate_is_dropped() -> None:
    state = run_scd1([changes([(None, None, None, "t", 5)]), changes([(7, "late", "z", "c", 2)])])
    assert scd1_table(state) == []


def test_scd1_batch_has_one_row_per_key() -> None:
    batch = changes([(1, "a", "x", "c", 1), (1, "b", "x", "u", 3), (1, "b", "x", "u", 3), (2, "c", "y", "c", 2)])
    actions = plan_scd1(batch, KEYS)
    assert sorted(actions.rows.column("userId").to_pylist()) == [1, 2]
    assert actions.upserts.num_rows == 2 and actions.deletes.num_rows == 0


def test_scd1_duplicate_delivery_is_idempotent() -> None:
    batch = changes(DOC_INPUT)
    assert scd1_table(run_scd1([batch, batch, batch])) == scd1_table(run_scd1([batch]))


def test_scd2_late_event_splits_the_enclosing_version() -> None:
    rows = run_scd2([changes([(1, "a", "x", "c", 1), (1, "c", "x", "u", 9)]), changes([(1, "b", "x", "u", 5)])])
    assert scd2_table(rows) == [(1, "a", "x", 1, 5), (1, "b", "x", 5, 9), (1, "c", "x", 9, None)]


def test_scd2_late_event_after_a_delete_stays_closed() -> None:
    rows = run_scd2([changes([(1, "a", "x", "c", 1), (1, None, None, "d", 9)]), changes([(1, "b", "x", "u", 5)])])
    assert scd2_table(rows) == [(1, "a", "x", 1, 5), (1, "b", "x", 5, 9)]


def test_scd2_untracked_change_updates_current_version_in_place() -> None:
    rows = run_scd2([changes([(1, "a", "x", "c", 1)]), changes([(1, "a", "y", "u", 2)])], tracked=["name"])
    assert scd2_table(rows) == [(1, "a", "y", 1, None)]
    assert rows.column(SEQ).to_pylist() == [seq(2)]


# Found by hypothesis: key 4 opens (a, y) at 5, changes the tracked name at 7, is deleted at 13 and
# changes back at 15. The test's replays once put a copy of the batch (14, 15) before the batch
# holding 7..13: 15, then untracked-only, folded into the version opened at 5, whose city y was lost,
# and 7 then closed that version at 7 showing 15's city x instead.
REPLAY_BEFORE_ITS_PREDECESSOR = [
    (1, "c", "a", "x"), (3, "c", "a", "x"), (1, "c", "a", "x"), (3, "c", "a", "x"), (4, "c", "a", "y"),
    (2, "c", "a", "x"), (4, "c", "b", "x"), (3, "c", "a", "x"), (2, "c", "a", "x"), (2, "d", "b", "y"),
    (1, "u", "a", "x"), (3, "u", "a", "x"), (4, "d", "b", "x"), (3, "u", "a", "y"), (4, "u", "a", "x"),
    (3, "c", "a", "x"), (1, "u", "b", "x"), (2, "u", "b", "x"), (3, "c", "b", "x"),
]  # fmt: skip


def test_scd2_late_change_splitting_a_version_that_absorbed_changes_is_refused() -> None:
    rows = {row[4]: row for row in stream(REPLAY_BEFORE_ITS_PREDECESSOR, truncates=False)}
    batches = [[rows[n] for n in range(1, 7)], [rows[14], rows[15]], [rows[n] for n in range(7, 20)]]
    with pytest.raises(ChangeBatchError, match="folded into its version"):
        run_scd2([changes(b) for b in batches], tracked=["name"])
    in_order = [[rows[n] for n in range(1, 7)], [rows[n] for n in range(7, 14)], [rows[n] for n in range(14, 20)]]
    one = scd2_table(run_scd2([changes(list(rows.values()))], tracked=["name"]))
    assert (4, "a", "y", 5, 7) in one
    assert scd2_table(run_scd2([changes(b) for b in in_order], tracked=["name"])) == one
    # A late delete or truncate inside such a version is refused too; one before it is not.
    folded = [changes([(1, "a", "y", "c", 5)]), changes([(1, "a", "x", "u", 15)])]
    for late in [(1, None, None, "d", 10), (None, None, None, "t", 10), (1, "b", "w", "u", 15)]:
        with pytest.raises(ChangeBatchError, match="folded into its version"):
            run_scd2([*folded, changes([late])], tracked=["name"])
    assert scd2_table(run_scd2([*folded, changes([(1, "b", "w", "u", 3)])], tracked=["name"])) == [
        (1, "b", "w", 3, 5),
        (1, "a", "x", 5, None),
    ]


def test_scd2_duplicate_delivery_changes_nothing() -> None:
    first = run_scd2([changes(DOC_INPUT)])
    actions = plan_scd2(changes(DOC_INPUT), KEYS, first)
    assert actions.versions.num_rows == 0 and actions.removed.num_rows == 0


def test_scd2_truncate_closes_open_versions() -> None:
    rows = run_scd2([changes([(1, "a", "x", "c", 1), (2, "b", "y", "c", 2)]), changes([(None, None, None, "t", 4)])])
    assert scd2_table(rows) == [(1, "a", "x", 1, 4), (2, "b", "y", 2, 4)]


def test_contract_violations_are_clear_errors() -> None:
    with pytest.raises(ChangeBatchError, match="lacks column"):
        check_changes(changes(DOC_INPUT).drop_columns([OP]), KEYS)
    with pytest.raises(ChangeBatchError, match="op code"):
        check_changes(changes([(1, "a", "x", "m", 1)]), KEYS)
    with pytest.raises(ChangeBatchError, match="track_history_columns"):
        plan_scd2(changes(DOC_INPUT), KEYS, track_history_columns=["nope"])


# ----------------------------------------------------------------------- property: batching never matters
# Each example plans and applies ~3-8 micro-batches (~0.1-0.25 s); 25 examples per property keep
# the module at seconds. CI runs hypothesis derandomized (tests/conftest.py), so these are 25 fixed
# streams of up to 25 events over 4 keys (every op, truncates, shuffles, replays); the worked
# examples and the named late/replay cases above pin the edge cases a random search would hunt for.
# Locally (no CI) each run draws fresh examples, so the search still widens over time.
PROPERTY_EXAMPLES = 25

event = st.tuples(
    st.integers(1, 4),
    st.sampled_from(["c", "u", "u", "d"]),
    st.sampled_from(["a", "b"]),
    st.sampled_from(["x", "y"]),
)


def stream(draw_events: list[tuple[Any, ...]], truncates: bool) -> list[tuple[Any, ...]]:
    rows = []
    for n, (key, op, name, city) in enumerate(draw_events, start=1):
        if truncates and key == 4 and op == "d":
            rows.append((None, None, None, "t", n))
        elif op == "d":
            rows.append((key, None, None, "d", n))
        else:
            rows.append((key, name, city, op, n))
    return rows


def deliveries(rows: list[tuple[Any, ...]], rnd: random.Random, shuffle: bool) -> list[pa.Table]:
    delivered = list(rows)
    if shuffle:
        rnd.shuffle(delivered)
    batches: list[list[tuple[Any, ...]]] = []
    while delivered:
        size = rnd.randint(1, max(1, len(delivered)))
        batches.append(delivered[:size])
        delivered = delivered[size:]
    # Replays: a whole earlier batch again (anywhere after it), and stray duplicates of earlier events.
    for _ in range(rnd.randint(0, 2)):
        replayed = rnd.randrange(len(batches))
        batches.insert(rnd.randint(replayed + 1, len(batches)), list(batches[replayed]))
    seen = [r for b in batches for r in b]
    batches.append(rnd.sample(seen, k=min(len(seen), rnd.randint(0, 3))) or [seen[0]])
    return [changes(b) for b in batches]


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(event, min_size=1, max_size=25), st.randoms(use_true_random=False))
def test_scd1_any_batching_and_replay_equals_one_sorted_batch(events: list[Any], rnd: random.Random) -> None:
    rows = stream(events, truncates=True)
    one = run_scd1([changes(sorted(rows, key=lambda r: r[4]))])
    assert scd1_table(run_scd1(deliveries(rows, rnd, shuffle=True))) == scd1_table(one)


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(event, min_size=1, max_size=25), st.randoms(use_true_random=False))
def test_scd2_any_batching_and_replay_equals_one_sorted_batch(events: list[Any], rnd: random.Random) -> None:
    rows = stream(events, truncates=False)
    one = run_scd2([changes(sorted(rows, key=lambda r: r[4]))])
    assert scd2_table(run_scd2(deliveries(rows, rnd, shuffle=True))) == scd2_table(one)


def test_scd2_delete_arriving_before_the_insert_is_remembered() -> None:
    rows = run_scd2([changes([(2, None, None, "d", 7)]), changes([(2, "a", "x", "c", 2)])])
    assert scd2_table(rows) == [(2, "a", "x", 2, 7)]


def test_scd2_delete_left_behind_a_late_delete_is_remembered() -> None:
    # d@5 arrives after d@10 closed the version: d@10 now closes nothing, yet bounds c@7.
    batches = [changes([(1, "a", "x", "c", 3), (1, None, None, "d", 10)]), changes([(1, None, None, "d", 5)])]
    state = run_scd2_state([*batches, changes([(1, "b", "y", "u", 7)])])
    assert scd2_table(state.rows) == [(1, "a", "x", 3, 5), (1, "b", "y", 7, 10)]
    assert [Sequence.from_sortable(v).commit_lsn for v in state.tombstones.column(SEQ).to_pylist()] == [10]


def test_scd2_tombstones_hold_only_deletes_that_close_nothing() -> None:
    state = run_scd2_state([changes(DOC_INPUT), changes([(9, None, None, "d", 8)])])
    assert state.tombstones.column("userId").to_pylist() == [9]


def test_scd2_late_change_older_than_a_truncate_opens_a_closed_version() -> None:
    rows = run_scd2([changes([(None, None, None, "t", 5)]), changes([(7, "late", "z", "c", 2)])])
    assert scd2_table(rows) == [(7, "late", "z", 2, 5)]


def test_scd2_late_truncate_shortens_closed_versions_of_keys_outside_the_batch() -> None:
    first = changes([(1, "a", "x", "c", 3), (1, None, None, "d", 10), (2, "b", "y", "c", 2), (2, "c", "y", "u", 9)])
    rows = run_scd2([first, changes([(None, None, None, "t", 5)]), changes([(1, "d", "z", "u", 7)])])
    assert scd2_table(rows) == [(1, "a", "x", 3, 5), (1, "d", "z", 7, 10), (2, "b", "y", 2, 5), (2, "c", "y", 9, None)]


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(event, min_size=1, max_size=25), st.randoms(use_true_random=False))
def test_scd2_truncates_any_batching_and_replay_equals_one_sorted_batch(events: list[Any], rnd: random.Random) -> None:
    rows = stream(events, truncates=True)
    one = run_scd2([changes(sorted(rows, key=lambda r: r[4]))])
    assert scd2_table(run_scd2(deliveries(rows, rnd, shuffle=True))) == scd2_table(one)


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(event, min_size=1, max_size=25), st.randoms(use_true_random=False))
@example(events=REPLAY_BEFORE_ITS_PREDECESSOR, rnd=random.Random(1391))
def test_scd2_tracked_subset_in_order_batching_and_replay(events: list[Any], rnd: random.Random) -> None:
    # Out-of-order *tracked* changes inside a version that absorbed untracked ones cannot be
    # rebuilt exactly, and are refused (see plan_scd2), so this holds for in-order delivery + replays.
    rows = stream(events, truncates=False)
    one = run_scd2([changes(rows)], tracked=["name"])
    assert scd2_table(run_scd2(deliveries(rows, rnd, shuffle=False), tracked=["name"])) == scd2_table(one)
