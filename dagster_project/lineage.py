"""Which assets a ``headwater.yaml`` defines and how they connect (pure: config in, keys out).

* a captured table's raw topic ``<source>.<schema>.<table>`` -> key ``[source, schema, table]``
  (group ``sources``; one capture per source materialises all of its tables);
* a feed -> ``["feeds", name]`` (group ``feeds``), upstream its ``from`` and lookups;
* a warehouse table -> ``["warehouse", name]`` (group ``warehouse``), upstream its ``from``;
* a sink -> ``["sinks", name]`` (group ``sinks``), upstream the topics and feeds its ``from``
  names or globs match among those the config knows.

Tables of a source configured by ``schemas:`` are known only once captured, so they
come from the ``from:`` references of feeds and tables (a topic nothing reads needs no
asset for lineage).
"""

from __future__ import annotations

import fnmatch
import re

from dagster import AssetKey

from capture.kinds import kind_of
from core.config import ProjectConfig

SOURCES_GROUP = "sources"
FEEDS_GROUP = "feeds"
WAREHOUSE_GROUP = "warehouse"
SINKS_GROUP = "sinks"


def _part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def topic_key(topic: str) -> AssetKey:
    """``shop.public.customers`` -> ``AssetKey(["shop", "public", "customers"])``."""
    return AssetKey([_part(p) for p in topic.split(".")])


def feed_key(name: str) -> AssetKey:
    """The asset key of feed ``name``."""
    return AssetKey(["feeds", _part(name)])


def warehouse_key(name: str) -> AssetKey:
    """The asset key of warehouse table ``name``."""
    return AssetKey(["warehouse", _part(name)])


def sink_key(name: str) -> AssetKey:
    """The asset key of sink ``name``."""
    return AssetKey(["sinks", _part(name)])


def source_topics(config: ProjectConfig) -> dict[str, list[str]]:
    """Source name -> the raw topics it writes that the config knows of (sorted)."""
    references = {up for f in config.feeds.values() for up in (f.from_, *f.lookups.values())}
    references |= {t.from_ for t in config.warehouse.tables.values()}
    references |= {name for sink in config.sinks.values() for name in sink.from_ if not any(c in name for c in "*?[")}
    topics: dict[str, list[str]] = {}
    for name, source in config.sources.items():
        known = set(kind_of(config, name).table_topics(name, source.tables or ()))
        known |= {ref for ref in references if ref.startswith(f"{name}.") and ref not in config.feeds}
        topics[name] = sorted(known)
    return topics


def upstream_key(config: ProjectConfig, name: str) -> AssetKey:
    """The asset a feed or table reads: a feed by name, else a raw topic."""
    return feed_key(name) if name in config.feeds else topic_key(name)


def feed_upstream_keys(config: ProjectConfig, name: str) -> list[AssetKey]:
    """The assets feed ``name`` reads: its ``from``, then its lookups (each once)."""
    feed = config.feeds[name]
    return [upstream_key(config, up) for up in dict.fromkeys((feed.from_, *feed.lookups.values()))]


def sink_upstream_keys(config: ProjectConfig, name: str) -> list[AssetKey]:
    """The assets sink ``name`` reads: the known raw topics and feeds its ``from`` names or globs match."""
    known = [topic for topics in source_topics(config).values() for topic in topics] + list(config.feeds)
    keys: dict[AssetKey, None] = {}
    for pattern in config.sinks[name].from_:
        if not any(char in pattern for char in "*?["):
            keys[upstream_key(config, pattern)] = None
            continue
        for topic in known:
            if fnmatch.fnmatchcase(topic, pattern):
                keys[upstream_key(config, topic)] = None
    return list(keys)
