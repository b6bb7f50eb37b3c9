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

import json
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

_SCRIPT = r"""
import json, pathlib, sys
import duckdb

request = json.loads(sys.argv[1])
con = duckdb.connect()
con.execute("SET autoinstall_known_extensions = false")
con.execute("SET autoload_known_extensions = false")
con.execute("SET TimeZone = 'UTC'")
for name in ("avro", "iceberg", "httpfs"):
    module = __import__(f"duckdb_extension_{name}")
    binary = pathlib.Path(module.__file__).parent / "extensions" / "v1.5.5" / f"{name}.duckdb_extension"
    con.execute(f"LOAD '{binary}'")
s3 = request.get("s3")
if s3:
    endpoint = s3["endpoint"].split("://", 1)
    con.execute(
        "CREATE SECRET (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, USE_SSL ?, URL_STYLE 'path')",
        [s3["key_id"], s3["secret"], s3["region"], endpoint[-1], endpoint[0] == "https"],
    )
con.execute(f"COPY (SELECT * FROM iceberg_scan(?)) TO '{request['out']}' (FORMAT parquet)", [request["metadata"]])
"""


def read_iceberg(metadata_location: str, storage_options: Mapping[str, str] | None = None) -> pa.Table:
    """Every row of the Iceberg table whose current metadata file is ``metadata_location``, read by DuckDB."""
    from harness.tool_cache import iceberg_reader_python

    request: dict[str, object] = {"metadata": metadata_location}
    if storage_options:
        options = {key.lower(): value for key, value in storage_options.items()}
        request["s3"] = {
            "endpoint": options["aws_endpoint_url"],
            "key_id": options["aws_access_key_id"],
            "secret": options["aws_secret_access_key"],
            "region": options.get("aws_region", "us-east-1"),
        }
    with tempfile.TemporaryDirectory() as scratch:
        request["out"] = str(Path(scratch) / "rows.parquet")
        result = subprocess.run(
            [str(iceberg_reader_python()), "-c", _SCRIPT, json.dumps(request)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            msg = f"DuckDB's iceberg reader failed: {result.stderr.strip()[-2000:]}"
            raise RuntimeError(msg)
        return pq.read_table(request["out"])


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
