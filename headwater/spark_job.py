"""What a Spark-running command holds for its lifetime: the log and one lean Spark session."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from headwater.config import ProjectConfig
from log.base import Log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery


@contextmanager
def spark_job(config: ProjectConfig, app_name: str) -> Iterator[tuple[SparkSession, Log]]:
    """Open the project's log and a Spark session; close both (and the JVM) on exit."""
    from derived_feeds.session import spark_session, stop_spark
    from log.factory import open_log

    log = open_log(config)
    spark = spark_session(app_name, local_dir=config.home_dir / "spark")
    try:
        yield spark, log
    finally:
        log.close()
        stop_spark(spark)


def follow(spark: SparkSession, queries: Sequence[StreamingQuery]) -> None:
    """Wait while the streaming ``queries`` run; Ctrl-C stops them (each finishes its micro-batch)."""
    try:
        spark.streams.awaitAnyTermination()
    except KeyboardInterrupt:
        for query in queries:
            query.stop()
