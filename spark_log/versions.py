"""Version pointers: which topic (feed) or Delta path (warehouse table) is current for a name.

``headwater reprocess NAME`` builds version N+1 beside version N and then switches
readers by replacing ``<home>/versions/<name>.json`` in one ``os.replace``: a reader that
resolves the pointer once per read sees either the old or the new version, never a mix.
Without a pointer file a name is at version 1: a feed's topic is its name, a table's path
is ``<warehouse>/<name>`` (``warehouse.path``, default ``<home>/warehouse``, maybe an object
store URL); version N > 1 is ``<name>.v<N>`` for both.

Pointer file (JSON): ``{"name", "kind": "feed"|"table", "version", "target", "previous":
[{"version", "target"}...]}`` where ``target`` is the topic or the Delta path; previous
versions stay listed until dropped (``--drop-old``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from core.config import ProjectConfig
from core.durable_files import replace_json

Kind = Literal["feed", "table"]


@dataclass(frozen=True, slots=True)
class Version:
    """One version of a feed or table: its number and where it lives."""

    name: str
    kind: Kind
    number: int
    target: str
    previous: tuple[tuple[int, str], ...] = field(default=())

    @property
    def topic(self) -> str:
        """The target of a feed version (its topic)."""
        return self.target


def version_target(config: ProjectConfig, name: str, kind: Kind, number: int) -> str:
    """Where version ``number`` of ``name`` lives (topic, or Delta path or URL)."""
    base = name if number == 1 else f"{name}.v{number}"
    if kind == "feed":
        return base
    return f"{config.warehouse_root}/{base}"


def pointer_path(config: ProjectConfig, name: str) -> Path:
    """``<home>/versions/<name>.json``."""
    return config.home_dir / "versions" / f"{name}.json"


def _kind_of(config: ProjectConfig, name: str) -> Kind:
    return "table" if name in config.warehouse.tables and name not in config.feeds else "feed"


def current_version(config: ProjectConfig, name: str, kind: Kind | None = None) -> Version:
    """The current version of ``name`` (version 1 when no pointer was ever written)."""
    kind = kind or _kind_of(config, name)
    path = pointer_path(config, name)
    try:
        data: dict[str, Any] = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return Version(name, kind, 1, version_target(config, name, kind, 1))
    previous = tuple((int(p["version"]), str(p["target"])) for p in data.get("previous", ()))
    return Version(name, data.get("kind", kind), int(data["version"]), str(data["target"]), previous)


def resolve_topic(config: ProjectConfig, name: str) -> str:
    """The topic to read for ``name``: a feed's current version's topic, else ``name`` itself (a raw topic)."""
    if name in config.feeds:
        return current_version(config, name, "feed").topic
    return name


def resolve_table_target(config: ProjectConfig, name: str) -> str:
    """The current Delta path or URL of warehouse table ``name`` (for ``headwater query`` and loaders)."""
    return current_version(config, name, "table").target


def switch_version(config: ProjectConfig, new: Version) -> None:
    """Make ``new`` current atomically (write a temp file, fsync, ``os.replace``); keep the old one listed."""
    old = current_version(config, new.name, new.kind)
    previous = [(n, t) for n, t in old.previous if n != new.number]
    if old.number != new.number:
        previous.append((old.number, old.target))
    _write(config, Version(new.name, new.kind, new.number, new.target, tuple(previous)))


def forget_previous(config: ProjectConfig, name: str, number: int) -> None:
    """Drop version ``number`` from the pointer's list of previous versions (after deleting it)."""
    current = current_version(config, name)
    kept = tuple((n, t) for n, t in current.previous if n != number)
    _write(config, Version(current.name, current.kind, current.number, current.target, kept))


def _write(config: ProjectConfig, version: Version) -> None:
    path = pointer_path(config, version.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "name": version.name,
        "kind": version.kind,
        "version": version.number,
        "target": version.target,
        "previous": [{"version": n, "target": t} for n, t in version.previous],
    }
    replace_json(path, body, indent=True)  # readers see the old file or the new one, never a partial write
