"""The source kinds: the one place that knows every kind (``sources.<name>.kind``), as ``log.factory`` does backends.

A kind is found by name. The built-in ones are imported only when a source of that kind is
used, so a process never loads a database driver it does not need. Another kind joins with
:func:`register_source_kind`, called by a plug-in module (:mod:`core.plugins`: an entry point or
``HEADWATER_PLUGINS``), which is imported before the first lookup.
"""

from __future__ import annotations

from collections.abc import Callable

from capture.errors import UnknownSourceError
from capture.source_kind import SourceKind
from core.config import ProjectConfig
from core.errors import ConfigError
from core.plugins import load_plugins

#: The default of ``sources.<name>.kind``.
DEFAULT_KIND = "postgres"


def _postgres() -> SourceKind:
    from capture.postgres.kind import PostgresSource

    return PostgresSource()


def _mysql() -> SourceKind:
    from capture.mysql.kind import MySqlSourceKind

    return MySqlSourceKind()


#: Kind name -> how to make it (imports its package when called).
_KINDS: dict[str, Callable[[], SourceKind]] = {"postgres": _postgres, "mysql": _mysql}
_MADE: dict[str, SourceKind] = {}


def register_source_kind(name: str, make: Callable[[], SourceKind]) -> None:
    """Make kind ``name`` known (``make`` is called once, at first use); a name already known is replaced."""
    _KINDS[name] = make
    _MADE.pop(name, None)


def known_kinds() -> tuple[str, ...]:
    """The kind names sources may use, sorted (plug-ins loaded)."""
    load_plugins()
    return tuple(sorted(_KINDS))


def source_kind(name: str, *, where: str = "kind") -> SourceKind:
    """The kind called ``name``; an unknown name is one line naming the known ones."""
    load_plugins()
    if name not in _KINDS:
        msg = f"{where}: unknown source kind {name!r}; known: {', '.join(known_kinds())}"
        raise ConfigError(msg, field=where)
    if name not in _MADE:
        _MADE[name] = _KINDS[name]()
    return _MADE[name]


def kind_of(config: ProjectConfig, source: str) -> SourceKind:
    """The kind of configured source ``source`` (refused in one line when there is no such source)."""
    if source not in config.sources:
        where = config.config_path or "headwater.yaml"
        known = ", ".join(config.sources) or "none"
        msg = f"no source named {source!r} in {where}; known: {known} (see 'headwater source list')"
        raise UnknownSourceError(msg, source=source)
    prefix = f"{config.config_path}: " if config.config_path else ""
    return source_kind(config.sources[source].kind, where=f"{prefix}sources.{source}.kind")
