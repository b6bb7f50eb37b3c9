"""Feed specs as a DAG: cycle errors at config load, run order, version pointers."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import parse_config
from core.errors import ConfigError
from derived_feeds.feed_graph import run_order
from spark_log.versions import Version, current_version, forget_previous, resolve_topic, switch_version


def feeds(**edges: str) -> dict:
    return {name: {"from": up, "sql": "SELECT * FROM source", "key": ["id"]} for name, up in edges.items()}


def config(tmp_path: Path, feed_map: dict):
    return parse_config({"project": "p", "home": str(tmp_path), "feeds": feed_map}, tmp_path / "headwater.yaml")


def test_a_cycle_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError) as error:
        config(tmp_path, feeds(a="b", b="c", c="a", d="raw.public.t"))
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'headwater.yaml'}: feeds.")
    assert ".from: feeds form a cycle" in message
    cycle = message.split("cycle (")[1].split(")", maxsplit=1)[0]
    assert set(cycle.split(" <- ")) == {"a", "b", "c"}
    assert "\n" not in message


def test_a_cycle_through_lookups_names_the_lookups_field(tmp_path):
    feed_map = feeds(a="raw.t", b="a")
    feed_map["a"]["lookups"] = {"other": "b"}
    with pytest.raises(ConfigError, match=r"feeds\.a\.lookups: feeds form a cycle \(a <- b <- a\)"):
        config(tmp_path, feed_map)


def test_self_reference_is_a_cycle(tmp_path):
    with pytest.raises(ConfigError, match=r"feeds\.a\.from: feeds form a cycle \(a <- a\)"):
        config(tmp_path, feeds(a="a"))


def test_run_order_puts_upstream_feeds_first(tmp_path):
    project = config(tmp_path, feeds(c="b", b="a", a="raw.t", x="raw.u"))
    order = run_order(project)
    assert order.index("a") < order.index("b") < order.index("c")
    assert run_order(project, ["c", "a"]) == ["a", "c"]


def test_version_pointer_switches_and_keeps_previous(tmp_path):
    project = config(tmp_path, feeds(a="raw.t"))
    assert resolve_topic(project, "a") == "a" and resolve_topic(project, "raw.t") == "raw.t"
    switch_version(project, Version("a", "feed", 2, "a.v2"))
    now = current_version(project, "a")
    assert (now.number, now.topic, now.previous) == (2, "a.v2", ((1, "a"),))
    assert resolve_topic(project, "a") == "a.v2"
    forget_previous(project, "a", 1)
    assert current_version(project, "a").previous == ()
