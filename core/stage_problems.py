"""Why a stage stopped and waits for an operator, kept where ``headwater status`` finds it.

A stage that refuses to go on (capture meeting a schema change it cannot follow, a feed whose
SQL reads a column its source renamed, a load whose table cannot take a column's new type)
prints its one ``error:`` line and exits; the same line is kept in
``<home>/problems/<kind>.<name>.json`` until the stage next starts past that point, so
``status`` (and anyone reading it later) sees what is wrong and what to do.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import orjson

from core.durable_files import replace_json

PROBLEMS_DIR = "problems"


def _path(home: Path, kind: str, name: str) -> Path:
    return home / PROBLEMS_DIR / f"{kind}.{name}.json"


def record_problem(home: Path, kind: str, name: str, message: str) -> None:
    """Keep ``message`` as the reason stage ``kind`` ``name`` stopped."""
    replace_json(_path(home, kind, name), {"message": message, "since_ms": int(time.time() * 1000)})


def clear_problem(home: Path, kind: str, name: str) -> None:
    """The stage got past what stopped it (idempotent)."""
    with contextlib.suppress(FileNotFoundError):
        _path(home, kind, name).unlink()


def stage_problem(home: Path, kind: str, name: str) -> str | None:
    """The kept reason stage ``kind`` ``name`` stopped, or None."""
    try:
        body = orjson.loads(_path(home, kind, name).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    return str(body.get("message"))
