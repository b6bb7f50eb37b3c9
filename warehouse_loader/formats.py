"""The table formats: the one place that knows every format (``warehouse.format``, per table ``format``).

A format is found by name. The built-in ones are imported only when a table of that format is
used. Another format joins with :func:`register_table_format`, called by a plug-in module
(:mod:`core.plugins`: an entry point or ``HEADWATER_PLUGINS``), imported before the first lookup.
"""

from __future__ import annotations

from collections.abc import Callable

from core.config import ProjectConfig
from core.errors import ConfigError
from core.plugins import load_plugins
from warehouse_loader.location import TableLocation, warehouse_location
from warehouse_loader.table_format import ProjectFormat, TableFormat

#: The default of ``warehouse.format``.
DEFAULT_FORMAT = "delta"


def _delta() -> TableFormat:
    from warehouse_loader.delta.format import DeltaFormat

    return DeltaFormat()


def _iceberg() -> TableFormat:
    from warehouse_loader.iceberg.format import IcebergFormat

    return IcebergFormat()


_FORMATS: dict[str, Callable[[], TableFormat]] = {"delta": _delta, "iceberg": _iceberg}
_MADE: dict[str, TableFormat] = {}


def register_table_format(name: str, make: Callable[[], TableFormat]) -> None:
    """Make format ``name`` known (``make`` is called once, at first use); a name already known is replaced."""
    _FORMATS[name] = make
    _MADE.pop(name, None)


def known_formats() -> tuple[str, ...]:
    """The format names tables may use, sorted (plug-ins loaded)."""
    load_plugins()
    return tuple(sorted(_FORMATS))


def table_format(name: str, *, where: str = "format") -> TableFormat:
    """The format called ``name``; an unknown name is one line naming the known ones."""
    load_plugins()
    if name not in _FORMATS:
        msg = f"{where}: unknown table format {name!r}; known: {', '.join(known_formats())}"
        raise ConfigError(msg, field=where)
    if name not in _MADE:
        _MADE[name] = _FORMATS[name]()
    return _MADE[name]


def format_of(config: ProjectConfig, table: str) -> TableFormat:
    """The format of warehouse table ``table``: its own ``format``, else ``warehouse.format``."""
    prefix = f"{config.config_path}: " if config.config_path else ""
    settings = config.warehouse.tables.get(table)
    if settings is not None and settings.format is not None:
        fmt = table_format(settings.format, where=f"{prefix}warehouse.tables.{table}.format")
    else:
        fmt = table_format(config.warehouse.format, where=f"{prefix}warehouse.format")
    return fmt.for_project(config) if isinstance(fmt, ProjectFormat) else fmt


def merge_on_read(config: ProjectConfig, table: str) -> bool:
    """Whether table ``table`` may be written merge-on-read: its setting, the warehouse's, else its format's default."""
    chosen = config.warehouse.merge_on_read_of(table)
    return format_of(config, table).merge_on_read_default if chosen is None else chosen


def used_formats(config: ProjectConfig) -> list[TableFormat]:
    """Every format a table of the config uses (``warehouse.format`` when there is no table)."""
    names = [format_of(config, table) for table in config.warehouse.tables] or [format_of(config, "")]
    return list({fmt.name: fmt for fmt in names}.values())


def check_warehouse(config: ProjectConfig) -> None:
    """Fail in one line when the warehouse's object store refuses or cannot be reached; writes nothing.

    A local warehouse is always fine (its directories are created on first write).
    """
    root: TableLocation = warehouse_location(config)
    for fmt in used_formats(config):
        fmt.check_store(root)
