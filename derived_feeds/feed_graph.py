"""Feeds form a DAG (``from`` and ``lookups`` naming other feeds); jobs run upstream first.

``core.config`` rejects cycles when the file is loaded, so ordering here never fails.
"""

from __future__ import annotations

import graphlib
from collections.abc import Sequence

from core.config import ProjectConfig
from derived_feeds.errors import FeedConfigError


def upstream_feeds(config: ProjectConfig, name: str) -> list[str]:
    """The feeds ``name`` reads directly (its ``from`` and lookups that are feeds)."""
    feed = config.feeds[name]
    return [up for up in (feed.from_, *feed.lookups.values()) if up in config.feeds]


def run_order(config: ProjectConfig, selected: Sequence[str] = ()) -> list[str]:
    """``selected`` feeds (all when empty) in DAG order: every feed after the feeds it reads."""
    unknown = [name for name in selected if name not in config.feeds]
    if unknown:
        known = ", ".join(config.feeds) or "none"
        raise FeedConfigError(unknown[0], "from", f"no feed named {unknown[0]!r}; known feeds: {known}")
    wanted = set(selected) or set(config.feeds)
    graph = {name: upstream_feeds(config, name) for name in config.feeds}
    order = graphlib.TopologicalSorter(graph).static_order()
    return [name for name in order if name in wanted]
