"""A Delta reader nobody here wrote: DuckDB 1.5.5's ``delta`` extension, in its own process and venv.

delta-rs writes most of Headwater's Delta commits and Headwater writes the merge-on-read ones
(deletion vectors, log entries) itself, so checking a table with Headwater's own view would
share its mistakes, and checking it with delta-rs gives only one other reading. This reader
shares neither: ``delta_scan`` is delta-kernel-rs (the Delta project's kernel) inside DuckDB;
it replays the log, applies deletion vectors and reads the files itself, local or ``s3://``.
DuckDB and the extensions come from PyPI wheels into ``.cache/delta-reader-venv``
(:func:`harness.tool_cache.delta_reader_python`; :mod:`harness.duckdb_scan` runs them).
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from harness.duckdb_scan import duckdb_scan


def read_delta(table: str, storage_options: Mapping[str, str] | None = None) -> pa.Table:
    """Every row of the Delta table at ``table`` (a local path or ``s3://`` URL), read by DuckDB's delta extension."""
    from harness.tool_cache import delta_reader_python

    return duckdb_scan(delta_reader_python(), ("httpfs", "delta"), "delta_scan", table, storage_options)
