"""Which topics a sink reads: its ``from:`` names and globs resolved against the log's topics.

A name that is a feed reads the feed's current topic (the caller passes how to resolve it:
feed versions live above this layer). A glob (``*``, ``?``, ``[...]``) matches the log's
topics except Headwater's internal ones, quarantine topics and dead-letter topics, which only
an exact name selects; a sink never reads its own dead-letter topic. Globs are resolved
again while the sink follows, so a table captured later joins.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Sequence

from log.topics import INTERNAL_PREFIX, dead_letter_topic, is_dead_letter_topic, is_quarantine_topic

_GLOB = frozenset("*?[")


def is_glob(pattern: str) -> bool:
    """True when ``pattern`` holds glob characters."""
    return any(char in _GLOB for char in pattern)


def resolve_inputs(
    sink: str, patterns: Sequence[str], topics: Iterable[str], resolve_name: Callable[[str], str] = str
) -> list[str]:
    """The topics ``patterns`` select among ``topics`` (exact names even before they exist), sorted."""
    existing = sorted(topics)
    chosen: set[str] = set()
    for pattern in patterns:
        if not is_glob(pattern):
            chosen.add(resolve_name(pattern))
            continue
        chosen.update(
            topic
            for topic in existing
            if fnmatch.fnmatchcase(topic, pattern)
            and not topic.startswith(INTERNAL_PREFIX)
            and not is_quarantine_topic(topic)
            and not is_dead_letter_topic(topic)
        )
    chosen.discard(dead_letter_topic(sink))
    return sorted(chosen)
