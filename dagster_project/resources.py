"""Dagster resources: the project config, the log and the Spark session.

Assets receive I/O through these, so a test (or another deployment) swaps the config
file, the log backend or the Spark session without touching an asset body.

Library modules are imported inside asset and check bodies: Dagster loads these definitions in
every process (webserver, daemon, each run), most of which never run a given stage.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource, InitResourceContext
from pydantic import PrivateAttr

from core.config import ProjectConfig, load_config
from log.base import Log
from log.factory import open_log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class HeadwaterProject(ConfigurableResource["HeadwaterProject"]):
    """The ``headwater.yaml`` the definitions were built from (read again per run: edits apply)."""

    config_path: str

    def load(self, *, needs_sources: bool = False) -> ProjectConfig:
        """The validated config; ``needs_sources`` fails on an unset ``${VAR}`` (capture needs the DSNs)."""
        return load_config(self.config_path, strict_env=needs_sources)


class HeadwaterLog(ConfigurableResource["HeadwaterLog"]):
    """The project's log backend (``log.backend``), opened per use and always closed."""

    project: HeadwaterProject

    @contextmanager
    def open(self) -> Iterator[Log]:
        """Open the configured log; closed when the block ends."""
        log = open_log(self.project.load())
        try:
            yield log
        finally:
            log.close()


class HeadwaterSpark(ConfigurableResource["HeadwaterSpark"]):
    """One Spark session per run process, where ``spark:`` in ``headwater.yaml`` says, started on first use.

    The session is stopped (JVM included) when the run ends, unless it already ran in this
    process before the run (a test's shared session): then it is left for its owner.
    """

    project: HeadwaterProject
    app_name: str = "headwater-dagster"
    _session: Any = PrivateAttr(default=None)
    _owned: bool = PrivateAttr(default=False)

    def session(self) -> SparkSession:
        """The run's session."""
        if self._session is None:
            from pyspark.sql import SparkSession

            from spark_log.job import open_session

            existing = SparkSession.getActiveSession()
            self._session = open_session(self.project.load(), self.app_name)
            self._owned = existing is None
        session: SparkSession = self._session
        return session

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        """Stop the session this resource started."""
        if self._session is not None and self._owned:
            from spark_log.session import stop_spark

            stop_spark(self._session)
        self._session = None
