"""Log lines of long-running commands: text for a terminal, or one JSON object per line.

``--log-format json`` gives every line as ``{"time", "level", "stage", "message", ...}``
plus the fields that matter where they are known: ``source``, ``table``, ``feed``,
``topic``, ``lsn``, ``offset``, ``pid``. Library code logs through :mod:`logging`; a capture
agent's thread is named ``capture-<source>``, so its lines carry the source without the
library passing it.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
import threading
from typing import Any, Literal, TextIO

import orjson

LogFormat = Literal["text", "json"]
#: Fields a line may carry besides time, level, stage and message.
FIELDS = ("source", "table", "feed", "topic", "lsn", "offset", "pid", "holder", "error")
_CAPTURE_THREAD = "capture-"


def json_line(stage: str, level: str, message: str, fields: dict[str, Any] | None = None) -> str:
    """One log line as a JSON object (no newline)."""
    now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    body: dict[str, Any] = {"time": now, "level": level, "stage": stage, "message": message}
    thread = threading.current_thread().name
    if thread.startswith(_CAPTURE_THREAD):
        body["source"] = thread.removeprefix(_CAPTURE_THREAD)
    for name, value in (fields or {}).items():
        if value is not None:
            body[name] = str(value) if name in ("lsn", "holder") else value
    return orjson.dumps(body, default=str).decode()


class JsonFormatter(logging.Formatter):
    """A :mod:`logging` record as :func:`json_line` (fields from ``extra=``)."""

    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON line."""
        fields = {name: getattr(record, name) for name in FIELDS if hasattr(record, name)}
        if record.exc_info and "error" not in fields:
            fields["error"] = self.formatException(record.exc_info).splitlines()[-1]
        message = record.getMessage()
        return json_line(getattr(record, "stage", self.stage), record.levelname.lower(), message, fields)


def configure_logging(log_format: LogFormat, stage: str, *, stream: TextIO | None = None) -> None:
    """Route warnings and errors of every library to ``stream`` (stderr) in ``log_format``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(stage))
    else:
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    # py4j logs an exception raised in a foreachBatch function with its traceback; the stage
    # reports the same failure as its one error line (and the traceback in its spark.log).
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
