"""Plug-in modules named in HEADWATER_PLUGINS are imported once, before a factory looks a name up."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from capture.kinds import known_kinds
from core import plugins
from core.errors import ConfigError
from warehouse_loader.formats import known_formats


def test_a_plugin_module_registers_its_kind_and_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hw_test_plugin.py").write_text(
        textwrap.dedent(
            """
            from capture.kinds import register_source_kind
            from capture.postgres.kind import PostgresSource
            from warehouse_loader.delta.format import DeltaFormat
            from warehouse_loader.formats import register_table_format

            IMPORTS = globals().get("IMPORTS", 0) + 1
            register_source_kind("plugged_kind", PostgresSource)
            register_table_format("plugged_format", DeltaFormat)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(plugins.PLUGINS_VARIABLE, " hw_test_plugin , ")
    assert "plugged_kind" in known_kinds() and "plugged_format" in known_formats()
    known_kinds()
    assert sys.modules["hw_test_plugin"].IMPORTS == 1  # imported once


def test_a_plugin_that_cannot_be_imported_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugins.PLUGINS_VARIABLE, "no_such_headwater_plugin")
    with pytest.raises(ConfigError) as error:
        known_formats()
    assert "\n" not in str(error.value) and "cannot import plug-in 'no_such_headwater_plugin'" in str(error.value)
