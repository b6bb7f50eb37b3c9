"""Where a streaming query stands in the log, committed to a consumer group.

Spark keeps a query's real position in its checkpoint; committing the same position
to a consumer group lets ``headwater status`` show lag on any backend. The position is
the micro-batch's ``endOffset`` from Spark's own progress report (no extra pass over the
data), so records the source skips (tombstones) count as read too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql.streaming.listener import StreamingQueryListener

from log.base import Log, TopicPartition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: One listener per Spark session (``--follow``); ``availableNow`` runs commit when the query ends.
_committers: dict[int, ProgressCommitter] = {}


def commit_progress(log: Log, group: str, progress: Any) -> None:
    """Commit a query progress' ``endOffset`` (``{"<topic>": {"<partition>": next}}``) to consumer group ``group``.

    Spark's own progress report is the position: no extra pass over the micro-batch.
    """
    sources = progress["sources"] if isinstance(progress, dict) else progress.sources
    if not sources:
        return
    end = sources[0]["endOffset"] if isinstance(sources[0], dict) else sources[0].endOffset
    if isinstance(end, str):
        end = orjson.loads(end)
    if not end:
        return
    offsets = {TopicPartition(t, int(p)): int(n) for t, parts in end.items() for p, n in parts.items()}
    log.commit(group, offsets)


class ProgressCommitter(StreamingQueryListener):
    """Commits each registered query's position after every micro-batch (for ``headwater status`` lag)."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.groups: dict[str, str] = {}

    def onQueryStarted(self, event: Any) -> None:
        """Nothing to do."""

    def onQueryProgress(self, event: Any) -> None:
        """Commit the batch's end offsets of a registered query."""
        group = self.groups.get(event.progress.name or "")
        if group is not None:
            commit_progress(self.log, group, event.progress)

    def onQueryIdle(self, event: Any) -> None:
        """Nothing to do."""

    def onQueryTerminated(self, event: Any) -> None:
        """Nothing to do."""


def track_progress(spark: SparkSession, log: Log, query_name: str, group: str) -> None:
    """Commit query ``query_name``'s position to ``group`` after each of its micro-batches."""
    committer = _committers.get(id(spark))
    if committer is None:
        committer = _committers[id(spark)] = ProgressCommitter(log)
        spark.streams.addListener(committer)
    committer.groups[query_name] = group
