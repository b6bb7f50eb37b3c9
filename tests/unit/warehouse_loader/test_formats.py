"""The table formats' factory: warehouse.format defaults to delta, a table may override it, unknown is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import parse_config
from core.errors import ConfigError
from warehouse_loader.delta.format import DeltaFormat
from warehouse_loader.formats import format_of, known_formats, used_formats


def config(tmp_path: Path, warehouse: dict[str, object]):
    return parse_config({"project": "p", "warehouse": warehouse}, tmp_path / "headwater.yaml")


def test_tables_are_delta_unless_told(tmp_path: Path) -> None:
    settings = config(tmp_path, {"tables": {"t": {"from": "s.public.t"}}})
    assert settings.warehouse.format == "delta" and settings.warehouse.tables["t"].format is None
    assert isinstance(format_of(settings, "t"), DeltaFormat)
    assert "delta" in known_formats()


def test_a_table_overrides_the_warehouse_format(tmp_path: Path) -> None:
    settings = config(
        tmp_path, {"format": "nosuch", "tables": {"t": {"from": "s.public.t", "format": "delta"}, "u": {"from": "x"}}}
    )
    assert format_of(settings, "t").name == "delta"
    with pytest.raises(ConfigError) as error:
        format_of(settings, "u")
    assert "\n" not in str(error.value)
    assert "warehouse.format: unknown table format 'nosuch'; known: " in str(error.value)
    with pytest.raises(ConfigError, match=r"warehouse\.format: unknown table format 'nosuch'"):
        used_formats(settings)


def test_an_unknown_table_format_names_the_table(tmp_path: Path) -> None:
    settings = config(tmp_path, {"tables": {"t": {"from": "s.public.t", "format": "orc"}}})
    with pytest.raises(ConfigError, match=r"warehouse\.tables\.t\.format: unknown table format 'orc'"):
        format_of(settings, "t")


def test_merge_on_read_is_one_setting_with_a_default_per_format(tmp_path: Path) -> None:
    from warehouse_loader.formats import merge_on_read

    tables = {
        "d": {"from": "x"},
        "i": {"from": "x", "format": "iceberg"},
        "i_off": {"from": "x", "format": "iceberg", "merge_on_read": False},
        "i_on": {"from": "x", "format": "iceberg", "merge_on_read": True},
        "i_hist": {"from": "x", "format": "iceberg", "mode": "scd2"},
    }
    unset = config(tmp_path, {"tables": tables})
    # Unset: Delta is merge-on-read (deletion vectors), Iceberg copy-on-write; a table's own setting wins.
    assert [merge_on_read(unset, t) for t in tables] == [True, False, False, True, False]
    told = config(tmp_path, {"merge_on_read": True, "tables": tables})
    assert [merge_on_read(told, t) for t in tables] == [True, True, False, True, True]
    off = config(tmp_path, {"merge_on_read": False, "tables": tables})
    assert [merge_on_read(off, t) for t in tables] == [False, False, False, True, False]


@pytest.mark.parametrize(
    ("warehouse", "message"),
    [
        (
            {"iceberg": {"write_mode": "merge-on-read"}},
            r"warehouse\.iceberg: write_mode is no longer an Iceberg setting: remove it and set "
            r"warehouse\.merge_on_read: true",
        ),
        (
            {"format": "iceberg", "tables": {"h": {"from": "x", "mode": "scd2", "merge_on_read": True}}},
            r"warehouse: tables\.h\.merge_on_read: an Iceberg SCD2 table is always copy-on-write",
        ),
    ],
)
def test_contradictory_merge_on_read_settings_are_refused_in_one_line(
    tmp_path: Path, warehouse: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        config(tmp_path, warehouse)
    assert "\n" not in str(error.value)
