"""The optional native hot path: the C extension :mod:`native._speedups`.

Every function of the extension has a pure-Python twin that defines its behaviour
(pgoutput tuple decoding, the type map + JSON of row images, Kafka's murmur2, the
file log's record encoding); the extension only answers the inputs it handles
exactly and hands everything else back to the twin, so output is byte-identical
either way (``tests/unit/native/test_native.py``).

``speedups`` is the extension module, or ``None`` when it cannot be imported (no
compiler at install time) or ``HEADWATER_NATIVE=0`` forces the Python path.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

logger = logging.getLogger(__name__)


def _load() -> ModuleType | None:
    if os.environ.get("HEADWATER_NATIVE", "1").strip() == "0":
        logger.debug("native speedups off (HEADWATER_NATIVE=0): using the pure-Python path")
        return None
    try:
        from native import _speedups
    except ImportError as exc:
        logger.debug("native speedups not available (%s): using the pure-Python path", exc)
        return None
    return _speedups


speedups: ModuleType | None = _load()
