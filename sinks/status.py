"""What ``headwater status`` and ``/metrics`` show of each sink: its state, lag and dead letters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.config import ProjectConfig
from log.base import Log, end_offsets, lag
from log.topics import dead_letter_topic, sink_group
from sinks.inputs import resolve_inputs
from sinks.state import read_state


def sink_topics(config: ProjectConfig, log: Log, name: str, resolve_name: Callable[[str], str] = str) -> list[str]:
    """The existing topics sink ``name`` reads now."""
    existing = set(log.list_topics())
    return [t for t in resolve_inputs(name, config.sinks[name].from_, existing, resolve_name) if t in existing]


def sink_lag(log: Log, name: str, topics: list[str]) -> int:
    """Records of ``topics`` the sink's group has not committed past."""
    return sum(sum(lag(log, sink_group(name), topic).values()) for topic in topics)


def sink_rows(config: ProjectConfig, log: Log, resolve_name: Callable[[str], str] = str) -> list[dict[str, Any]]:
    """One row per sink: ``sink``, ``kind``, ``topics``, ``state`` (``error`` when blocked or failed), ``lag``, ..."""
    rows = []
    existing = set(log.list_topics())
    for name, spec in config.sinks.items():
        topics = sink_topics(config, log, name, resolve_name)
        state = read_state(config, name)
        row: dict[str, Any] = {
            "sink": name,
            "kind": spec.kind,
            "group": sink_group(name),
            "topics": topics,
            "state": state["state"],
            "lag": sink_lag(log, name, topics),
        }
        if state.get("error"):
            row["error"] = state["error"]
        if state.get("since"):
            row["since"] = state["since"]
        dead = dead_letter_topic(name)
        row["dead_lettered"] = sum(end_offsets(log, dead).values()) if dead in existing else 0
        rows.append(row)
    return rows
