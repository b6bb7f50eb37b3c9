"""The last error of each stage command, kept for ``headwater status``.

A stage command (``capture``, ``feeds run``, ``load``, ``run``, ``log clean``) that stops with a
Headwater error prints its one line and exits; the line, its exit code and the time are kept in
``<home>/errors/<stage>.json`` (replaced whole), so ``status`` can say why a stage stopped after
its terminal is gone (a supervised ``run --follow`` child, a cron job). The next run of the stage
that ends cleanly removes it.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import orjson

from core.config import ProjectConfig
from core.durable_files import replace_json
from core.errors import EXIT_PERMANENT, HeadwaterError, PermanentError, one_line

#: Exit code of a failed command whose error is not permanent (retrying may help).
_EXIT_FAILED = 1


def errors_dir(config: ProjectConfig) -> Path:
    """``<home>/errors``."""
    return config.home_dir / "errors"


def _path(config: ProjectConfig, stage: str) -> Path:
    return errors_dir(config) / f"{stage.replace(' ', '-')}.json"


def remember(config: ProjectConfig, stage: str, error: HeadwaterError) -> None:
    """Keep ``error`` as the last error of ``stage``."""
    body = {
        "stage": stage,
        "error": one_line(str(error)),
        "exit_code": EXIT_PERMANENT if isinstance(error, PermanentError) else _EXIT_FAILED,
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "pid": os.getpid(),
    }
    path = _path(config, stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_json(path, body)


def forget(config: ProjectConfig, stage: str) -> None:
    """``stage`` ended cleanly: its last error no longer says how it stands."""
    _path(config, stage).unlink(missing_ok=True)


def last_errors(config: ProjectConfig) -> list[dict[str, Any]]:
    """Every stage's last error, oldest first."""
    directory = errors_dir(config)
    found = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        try:
            found.append(orjson.loads(path.read_bytes()))
        except (OSError, orjson.JSONDecodeError):
            continue  # being replaced, or not ours
    return sorted(found, key=lambda row: str(row.get("at", "")))
