"""Plug-ins: modules that register source kinds or table formats with their factories when imported.

The factories (``capture.kinds``, ``warehouse_loader.formats``) call :func:`load_plugins` before
they look a name up. A plug-in is named by an installed distribution's entry point in the group
``headwater.plugins`` (the module is imported; nothing is called), or listed, comma-separated,
in the environment variable ``HEADWATER_PLUGINS`` (e.g. a test's own kinds). Importing is the
whole protocol: the module calls ``register_source_kind`` / ``register_table_format``.
"""

from __future__ import annotations

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


def plugin_modules() -> list[str]:
    """The plug-in modules to import: entry points first, then ``HEADWATER_PLUGINS``, each once."""
    names = [point.value for point in entry_points(group=ENTRY_POINT_GROUP)]
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
