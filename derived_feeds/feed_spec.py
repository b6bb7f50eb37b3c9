"""A feed as the jobs see it: its config plus where it writes (topic, quarantine, checkpoint, state).

Naming contract: the feed's topic is its name (``customers_clean``); a reprocessed version
N > 1 writes ``customers_clean.v<N>`` (``spark_log.versions`` says which is current);
rows dropped by expectations go to ``<topic>.quarantine``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from core.config import FeedConfig, ProjectConfig
from core.durable_files import replace_file
from derived_feeds.errors import FeedConfigError
from derived_feeds.feed_graph import run_order
from log.errors import InvalidTopicNameError
from log.topics import feed_group, quarantine_topic, validate_topic_name
from spark_log.versions import current_version, resolve_topic


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
    #: ``spark.checkpoint_path`` (default ``<home>/checkpoints``).
    checkpoints: Path

    @property
    def key(self) -> tuple[str, ...]:
        """The feed's key columns (output columns of its SQL)."""
        return self.config.key

    @property
    def quarantine_topic(self) -> str:
        """Where rows dropped by expectations go."""
        return quarantine_topic(self.topic)

    @property
    def checkpoint(self) -> Path:
        """Spark's checkpoint of this version of the feed (one per output topic)."""
        return self.checkpoints / "feeds" / self.name / self.topic

    @property
    def state_dir(self) -> Path:
        """The enrichment state (latest values of both sides), versioned by micro-batch."""
        return self.checkpoint / "lookup_state"

    @property
    def plan_class_file(self) -> Path:
        """Where the feed job records the plan class of this version's SQL (for ``headwater status``)."""
        return self.checkpoint / "plan_class.json"

    def recorded_plan_class(self) -> str | None:
        """The plan class the feed job decided when it last planned this version (None before its first run)."""
        try:
            return str(orjson.loads(self.plan_class_file.read_bytes())["plan_class"])
        except (FileNotFoundError, KeyError, ValueError):
            return None

    def record_plan_class(self, plan_class: str) -> None:
        """Remember the plan class (replaced whole: a crash leaves the old or the new)."""
        self.checkpoint.mkdir(parents=True, exist_ok=True)
        replace_file(self.plan_class_file, orjson.dumps({"plan_class": plan_class, "sql": self.config.sql}))

    @property
    def group(self) -> str:
        """The consumer group of the feed's input position."""
        return feed_group(self.name)

    @property
    def input_fields(self) -> dict[str, str]:
        """Each input topic by the config field that names it: ``from``, ``lookups.<view>``."""
        named = {"from": self.source_topic, **self.lookup_topics}
        return {("from" if view == "from" else f"lookups.{view}"): topic for view, topic in named.items()}

    @property
    def input_topics(self) -> tuple[str, ...]:
        """The stream's topics: the source first, then the lookups' topics."""
        return (self.source_topic, *sorted(set(self.lookup_topics.values()) - {self.source_topic}))


def feed_spec(config: ProjectConfig, name: str, *, topic: str | None = None, version: int | None = None) -> FeedSpec:
    """The spec of feed ``name``, reading the current versions of its inputs.

    ``topic``/``version`` override the output (``headwater reprocess`` writes version N+1).
    """
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
        checkpoints=config.checkpoint_dir,
    )


def check_before_spark(config: ProjectConfig, topics: Collection[str], names: Sequence[str] = ()) -> None:
    """Check what needs no Spark session (its start takes seconds) for feeds ``names`` (all when empty).

    Each feed's topic must be a legal, non-reserved name; its inputs must exist in the log
    (``topics``) or be written by a feed of this project; its expectations must be ones a
    feed can evaluate, with an action. Column-level checks need the SQL's output schema and
    stay in :func:`derived_feeds.feed_job.plan_feed`.
    """
    # pyspark (the expectations are Spark predicates): `headwater status` reads feed specs without Spark.
    from derived_feeds.expectations import checked_rule

    produced = set(topics) | {feed_spec(config, name).topic for name in config.feeds}
    for name in run_order(config, names):
        spec = feed_spec(config, name)
        try:
            validate_topic_name(spec.topic)
            validate_topic_name(spec.quarantine_topic)
        except InvalidTopicNameError as exc:
            raise FeedConfigError(name, "(name)", f"{exc}; rename the feed") from None
        for where, topic in spec.input_fields.items():
            if topic not in produced:
                msg = f"topic {topic!r} does not exist (yet); run its producer first or fix the name"
                raise FeedConfigError(name, where, msg)
        for index, expectation in enumerate(spec.config.expectations):
            where = f"expectations[{index}]"
            checked_rule(name, where, expectation, name_field=f"{where}.expect")
