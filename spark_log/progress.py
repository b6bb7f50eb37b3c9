"""Where a streaming query stands in the log, committed to a consumer group.

Spark keeps a query's real position in its checkpoint; committing the same position
to a consumer group lets ``headwater status`` show lag on any backend. The position is
the micro-batch's ``endOffset`` from Spark's own progress report (no extra pass over the
data), so records the source skips (tombstones) count as read too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import orjson

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


class ProgressCommitter:
    """Commits each registered query's position after every micro-batch (for ``headwater status`` lag).

    A listener of the session's streaming queries, implementing Spark's Java listener interface
    through py4j itself rather than subclassing pyspark's ``StreamingQueryListener``: pyspark's
    wrapper converts every event of every query to Python objects field by field, a py4j round
    trip per field, before the listener sees it. With 31 queries following a writer that was 20 % of
    the CLI's Python CPU and a third of its JVM's (the listener thread answering those calls). Here a
    progress event costs one call for the query's name and, for a registered query, one for the
    progress as JSON.
    """

    def __init__(self, log: Log) -> None:
        self.log = log
        self.groups: dict[str, str] = {}

    def onQueryStarted(self, event: Any) -> None:
        """Nothing to do."""

    def onQueryProgress(self, event: Any) -> None:
        """Commit the batch's end offsets of a registered query."""
        progress = event.progress()
        group = self.groups.get(progress.name() or "")
        if group is not None:
            commit_progress(self.log, group, orjson.loads(progress.json()))

    def onQueryIdle(self, event: Any) -> None:
        """Nothing to do."""

    def onQueryTerminated(self, event: Any) -> None:
        """Nothing to do."""

    class Java:
        """The Java interface py4j presents this object as."""

        implements: ClassVar[list[str]] = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def track_progress(spark: SparkSession, log: Log, query_name: str, group: str) -> None:
    """Commit query ``query_name``'s position to ``group`` after each of its micro-batches."""
    committer = _committers.get(id(spark))
    if committer is None:
        committer = _committers[id(spark)] = ProgressCommitter(log)
        _add_listener(spark, committer)
    committer.groups[query_name] = group


def _add_listener(spark: SparkSession, listener: ProgressCommitter) -> None:
    """Register ``listener`` with the session's streaming queries, as ``spark.streams.addListener`` does."""
    from pyspark.java_gateway import ensure_callback_server_started

    context = spark.sparkContext
    ensure_callback_server_started(context._gateway)  # type: ignore[no-untyped-call]  # the JVM calls back through it
    streaming = context._jvm.org.apache.spark.sql.streaming  # type: ignore[union-attr]
    spark.streams._jsqm.addListener(streaming.PythonStreamingQueryListenerWrapper(listener))
