"""When maintenance last ran on a table build: ``<home>/maintenance/<build>.json``.

Written by a maintenance pass (:mod:`operations.maintain`) and by the loader's own compaction
(:class:`warehouse_loader.maintenance.BuriedRows`); read by the policy (when to vacuum),
``status`` and ``/metrics``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import orjson

from core.durable_files import replace_json


def _state_path(home_dir: Path, build: str) -> Path:
    return home_dir / "maintenance" / f"{build}.json"


def last_runs(home_dir: Path, build: str) -> dict[str, str]:
    """When compaction, checkpoint and vacuum last ran on table build ``build`` (ISO times; absent: never)."""
    try:
        data = orjson.loads(_state_path(home_dir, build).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)}


def record_runs(home_dir: Path, build: str, tasks: Sequence[str], now: dt.datetime) -> None:
    """Record that ``tasks`` (``compaction``, ``checkpoint``, ``vacuum``) ran on ``build`` at ``now``."""
    state = last_runs(home_dir, build)
    for task in tasks:
        state[f"last_{task}"] = now.isoformat().replace("+00:00", "Z")
    path = _state_path(home_dir, build)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_json(path, state)
