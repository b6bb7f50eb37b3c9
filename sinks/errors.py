"""Errors of the sinks: a target that is down (retried) and a sink that cannot run as configured."""

from __future__ import annotations

from core.errors import HeadwaterError, PermanentError, TransientError, one_line


class SinkError(HeadwaterError):
    """Base class of sink errors; ``sink`` names the sink."""

    sink: str


class TargetUnavailableError(SinkError, TransientError):
    """The target cannot be reached or did not accept a delivery now: retried with backoff, nothing is skipped."""

    def __init__(self, sink: str, detail: object) -> None:
        super().__init__(f"sink {sink}: target unavailable: {one_line(detail)}; retrying with backoff")
        self.sink = sink


class SinkConfigError(SinkError, PermanentError):
    """The sink cannot deliver what it reads as configured (a bad filter, a column it cannot write exactly).

    With ``field`` the message names the config file and ``sinks.<sink>.<field>``, as load errors do.
    """

    def __init__(self, sink: str, detail: str, *, field: str | None = None) -> None:
        if field is None:
            super().__init__(f"sink {sink}: {detail}")
        else:
            from core.config import loaded_config_name

            super().__init__(f"{loaded_config_name()}: sinks.{sink}.{field}: {detail}")
        self.sink = sink
        self.field = field
