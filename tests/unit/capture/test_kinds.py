"""The source kinds' factory: sources.<name>.kind defaults to postgres, an unknown kind is one line, kinds plug in."""

from __future__ import annotations

from pathlib import Path

import pytest

from capture.errors import UnknownSourceError
from capture.kinds import kind_of, known_kinds, register_source_kind, source_kind
from capture.postgres.kind import PostgresSource
from core.config import parse_config
from core.errors import ConfigError


def config(tmp_path: Path, **source: object):
    raw = {"project": "p", "sources": {"shop": {"dsn": "postgresql://u@h/db", "tables": ["public.t"], **source}}}
    return parse_config(raw, tmp_path / "headwater.yaml")


def test_a_source_without_a_kind_is_postgres(tmp_path: Path) -> None:
    settings = config(tmp_path)
    assert settings.sources["shop"].kind == "postgres"
    assert isinstance(kind_of(settings, "shop"), PostgresSource)
    assert "postgres" in known_kinds()


def test_an_unknown_kind_is_one_line_naming_the_field_and_the_known_kinds(tmp_path: Path) -> None:
    settings = config(tmp_path, kind="oracle")
    with pytest.raises(ConfigError) as error:
        kind_of(settings, "shop")
    message = str(error.value)
    assert "\n" not in message
    assert "sources.shop.kind: unknown source kind 'oracle'" in message and "postgres" in message


def test_a_kind_that_is_no_identifier_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sources\.shop\.kind"):
        config(tmp_path, kind="Post Gres")


def test_an_unknown_source_is_named(tmp_path: Path) -> None:
    with pytest.raises(UnknownSourceError, match="no source named 'nope'"):
        kind_of(config(tmp_path), "nope")


def test_a_registered_kind_is_made_once_at_first_use(tmp_path: Path) -> None:
    made: list[PostgresSource] = []

    def make() -> PostgresSource:
        made.append(PostgresSource())
        return made[-1]

    register_source_kind("made_once", make)
    try:
        assert made == []
        first = source_kind("made_once")
        assert source_kind("made_once") is first and made == [first]
        assert kind_of(config(tmp_path, kind="made_once"), "shop") is first
    finally:
        register_source_kind("made_once", PostgresSource)
