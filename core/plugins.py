"""Plug-ins: modules that register source kinds or table formats with their factories when imported.

The factories (``capture.kinds``, ``warehouse_loader.formats``) call :func:`load_plugins` before
they look a name up. A plug-in is named by an installed distribution's entry point in the group
``headwater.plugins`` (the module is imported; nothing is called), or listed, comma-separated,
in the environment variable ``HEADWATER_PLUGINS`` (e.g. a test's own kinds). Importing is the
whole protocol: the module calls ``register_source_kind`` / ``register_table_format``.
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
from importlib.metadata import entry_points

from core.errors import ConfigError

#: The entry-point group plug-in distributions declare their module in.
ENTRY_POINT_GROUP = "headwater.plugins"
#: The environment variable naming plug-in modules (comma-separated).
PLUGINS_VARIABLE = "HEADWATER_PLUGINS"

_loaded: set[str] = set()
_lock = threading.Lock()


@functools.cache
def _entry_point_modules() -> tuple[str, ...]:
    """The modules installed distributions declare, read once per process.

    Reading them scans every installed distribution's metadata: 15-20 ms, which every table
    format lookup (each ``query``, each loaded batch) paid before it was kept.
    """
    return tuple(point.value for point in entry_points(group=ENTRY_POINT_GROUP))


def plugin_modules() -> list[str]:
    """The plug-in modules to import: entry points first, then ``HEADWATER_PLUGINS``, each once."""
    names = list(_entry_point_modules())
    names += [name.strip() for name in os.environ.get(PLUGINS_VARIABLE, "").split(",") if name.strip()]
    return list(dict.fromkeys(names))


def load_plugins() -> None:
    """Import every plug-in module not imported yet; one that cannot be imported is one line naming it."""
    with _lock:
        for name in plugin_modules():
            if name in _loaded:
                continue
            try:
                importlib.import_module(name)
            except ImportError as exc:
                msg = f"{PLUGINS_VARIABLE} / entry point {ENTRY_POINT_GROUP}: cannot import plug-in {name!r} ({exc})"
                raise ConfigError(msg, field=PLUGINS_VARIABLE) from None
            _loaded.add(name)
