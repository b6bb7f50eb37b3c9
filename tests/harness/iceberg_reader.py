"""An Iceberg reader nobody here wrote: DuckDB 1.5.5's ``iceberg`` extension, in its own process and venv.

pyiceberg writes Headwater's Iceberg tables and plans the files Headwater's own readers read,
so checking a table with pyiceberg would share its mistakes. This reader shares nothing: DuckDB's
C++ extension parses the table's metadata JSON, its Avro manifest list and manifests and reads
the data files by field ID itself (``iceberg_scan(<metadata file>)``). It runs offline: DuckDB
and the extensions come from PyPI wheels into ``.cache/iceberg-reader-venv``
(:func:`harness.tool_cache.iceberg_reader_python`), loaded from their files, never downloaded.

The rows come back through a Parquet file (DuckDB writes it, pyarrow reads it): only transport.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from harness.duckdb_scan import duckdb_scan


def read_iceberg(metadata_location: str, storage_options: Mapping[str, str] | None = None) -> pa.Table:
    """Every row of the Iceberg table whose current metadata file is ``metadata_location``, read by DuckDB."""
    from harness.tool_cache import iceberg_reader_python

    return duckdb_scan(
        iceberg_reader_python(), ("avro", "iceberg", "httpfs"), "iceberg_scan", metadata_location, storage_options
    )


def three_reads(ref: Any, storage: dict[str, str] | None = None) -> list[list[dict[str, Any]]]:
    """The table's rows by pyiceberg's scan, Headwater's read and DuckDB's iceberg extension, each sorted."""
    from warehouse_loader.iceberg.commit import read_files
    from warehouse_loader.iceberg.scan import TableFiles

    table = ref.load()
    assert table is not None
    files = TableFiles.of(table)
    reads = [
        table.scan().to_arrow(),
        read_files(ref, files, list(files.files)),
        read_iceberg(table.metadata_location, storage),
    ]
    columns = sorted(reads[0].column_names)
    assert all(sorted(r.column_names) == columns for r in reads), [r.column_names for r in reads]
    return [sorted((r.select(columns).to_pylist()), key=repr) for r in reads]
