"""A feed as the jobs see it: its config plus where it writes (topic, quarantine, checkpoint, state).

Naming contract: the feed's topic is its name (``customers_clean``); a reprocessed version
N > 1 writes ``customers_clean.v<N>`` (``derived_feeds.versions`` says which is current);
rows dropped by expectations go to ``<topic>.quarantine``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from derived_feeds.feed_errors import FeedConfigError
from headwater.config import FeedConfig, ProjectConfig

#: Suffix of the topic that receives rows dropped by expectations (as capture's quarantine).
QUARANTINE_SUFFIX = ".quarantine"
#: Consumer group a feed commits its input position to (lag in ``headwater status``).
FEED_GROUP_PREFIX = "headwater.feed."


@dataclass(frozen=True, slots=True)
class FeedSpec:
    """One feed, resolved: what it reads (topics already version-resolved) and where it writes."""

    name: str
    config: FeedConfig
    source_topic: str
    lookup_topics: dict[str, str]
    topic: str
    version: int
    home: Path

    @property
    def key(self) -> tuple[str, ...]:
        """The feed's key columns (output columns of its SQL)."""
        return self.config.key

    @property
    def quarantine_topic(self) -> str:
        """Where rows dropped by expectations go."""
        return self.topic + QUARANTINE_SUFFIX

    @property
    def checkpoint(self) -> Path:
        """Spark's checkpoint of this version of the feed (one per output topic)."""
        return self.home / "checkpoints" / "feeds" / self.name / self.topic

    @property
    def state_dir(self) -> Path:
        """The enrichment state (latest values of both sides), versioned by micro-batch."""
        return self.checkpoint / "lookup_state"

    @property
    def group(self) -> str:
        """The consumer group of the feed's input position."""
        return FEED_GROUP_PREFIX + self.name

    @property
    def input_topics(self) -> tuple[str, ...]:
        """The stream's topics: the source first, then the lookups' topics."""
        return (self.source_topic, *sorted(set(self.lookup_topics.values()) - {self.source_topic}))


def feed_spec(config: ProjectConfig, name: str, *, topic: str | None = None, version: int | None = None) -> FeedSpec:
    """The spec of feed ``name``, reading the current versions of its inputs.

    ``topic``/``version`` override the output (``headwater reprocess`` writes version N+1).
    """
    from derived_feeds.versions import current_version, resolve_topic

    feed = config.feeds.get(name)
    if feed is None:
        known = ", ".join(config.feeds) or "none"
        raise FeedConfigError(name, "from", f"no feed named {name!r}; known feeds: {known}")
    if not feed.key:
        raise FeedConfigError(name, "key", "give at least one key column")
    if "source" in feed.lookups:
        raise FeedConfigError(name, "lookups", "'source' is the feed's own input; name the lookup differently")
    current = current_version(config, name)
    return FeedSpec(
        name=name,
        config=feed,
        source_topic=resolve_topic(config, feed.from_),
        lookup_topics={view: resolve_topic(config, topic) for view, topic in feed.lookups.items()},
        topic=topic or current.topic,
        version=version or current.number,
        home=config.home_dir,
    )
