"""The maintenance policy: what a pass runs for a table of a given shape (pure, no table)."""

from __future__ import annotations

import datetime as dt

from core.warehouse_config import MaintenanceConfig
from warehouse_loader.maintenance import RETENTION_FLOOR_S, TableShape, effective_retention_s, plan

NOW = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
SETTINGS = MaintenanceConfig(target_file_size=64 << 20, compact_min_small_files=16, compact_dirty_ratio=0.2)


def shape(**changes: object) -> TableShape:
    base: dict[str, object] = {
        "version": 500,
        "files": 4,
        "bytes": 4 << 30,
        "small_files": 0,
        "small_bytes": 0,
        "commits_since_checkpoint": 10,
        "last_vacuum": NOW - dt.timedelta(seconds=10),
    }
    return TableShape(**{**base, **changes})  # type: ignore[arg-type]


def test_a_fresh_table_needs_nothing() -> None:
    assert plan(shape(), SETTINGS, NOW).idle


def test_many_small_files_are_compacted_and_then_checkpointed() -> None:
    todo = plan(shape(small_files=16, small_bytes=16 << 20), SETTINGS, NOW)
    assert todo.compact and todo.checkpoint and not todo.expire


def test_few_small_files_holding_much_of_the_table_are_compacted() -> None:
    assert plan(shape(small_files=3, small_bytes=1 << 30), SETTINGS, NOW).compact  # 25 % of the bytes
    assert not plan(shape(small_files=3, small_bytes=1 << 20), SETTINGS, NOW).compact
    assert not plan(shape(small_files=1, small_bytes=4 << 30, bytes=4 << 30), SETTINGS, NOW).compact  # one file


def test_checkpoint_after_the_interval() -> None:
    assert plan(shape(commits_since_checkpoint=100), SETTINGS, NOW).checkpoint
    assert not plan(shape(commits_since_checkpoint=99), SETTINGS, NOW).checkpoint


def test_expiry_once_per_interval_and_at_first() -> None:
    assert plan(shape(last_vacuum=None), SETTINGS, NOW).expire
    assert plan(shape(last_vacuum=NOW - dt.timedelta(seconds=60)), SETTINGS, NOW).expire
    assert not plan(shape(last_vacuum=NOW - dt.timedelta(seconds=59)), SETTINGS, NOW).expire
    hourly = MaintenanceConfig(interval_s=86400)
    assert not plan(shape(last_vacuum=NOW - dt.timedelta(minutes=59)), hourly, NOW).expire
    assert plan(shape(last_vacuum=NOW - dt.timedelta(minutes=60)), hourly, NOW).expire


def test_retention_never_below_the_floor() -> None:
    assert effective_retention_s(MaintenanceConfig(retention_s=0)) == RETENTION_FLOOR_S
    assert effective_retention_s(MaintenanceConfig(retention_s=7 * 86400)) == 7 * 86400


def test_dirty_ratio() -> None:
    assert shape(small_files=2, small_bytes=1 << 30).dirty_ratio == 0.25
    assert shape(small_files=1, small_bytes=1 << 30).dirty_ratio == 0.0  # one file: nothing to pack
    assert shape(bytes=0).dirty_ratio == 0.0
