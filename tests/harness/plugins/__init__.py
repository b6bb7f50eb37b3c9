"""Test-only plug-ins proving the plug-in points: a replaying source kind, a Parquet-directory table format.

Importing this package registers them through the factories' hooks (``capture.kinds.register_source_kind``,
``warehouse_loader.formats.register_table_format``); a CLI process loads it with
``HEADWATER_PLUGINS=harness.plugins`` (and ``tests/`` on ``PYTHONPATH``). Nothing outside this
package knows them.
"""

from __future__ import annotations

from capture.kinds import register_source_kind
from harness.plugins.parquet_format import ParquetDirectoryFormat
from harness.plugins.replay_source import ReplaySource
from warehouse_loader.formats import register_table_format

register_source_kind(ReplaySource.name, ReplaySource)
register_table_format(ParquetDirectoryFormat.name, ParquetDirectoryFormat)
