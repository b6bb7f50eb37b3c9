"""A Delta reader nobody here wrote: DuckDB 1.5.5's ``delta`` extension, in its own process and venv.

delta-rs writes most of Headwater's Delta commits and Headwater writes the merge-on-read ones
(deletion vectors, log entries) itself, so checking a table with Headwater's own view would
share its mistakes, and checking it with delta-rs only one other reading. This reader shares
neither: ``delta_scan`` is delta-kernel-rs (the Delta project's kernel) inside DuckDB: it
replays the log, applies deletion vectors and reads the files itself, local or ``s3://``
(through a DuckDB S3 secret). It runs offline: DuckDB and the extensions come from PyPI wheels
into ``.cache/delta-reader-venv`` (:func:`harness.tool_cache.delta_reader_python`), loaded from
their files, never downloaded.

The rows come back through a Parquet file (DuckDB writes it, pyarrow reads it): only transport.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

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
for name in ("httpfs", "delta"):
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
con.execute(f"COPY (SELECT * FROM delta_scan(?)) TO '{request['out']}' (FORMAT parquet)", [request["table"]])
"""


def read_delta(table: str, storage_options: Mapping[str, str] | None = None) -> pa.Table:
    """Every row of the Delta table at ``table`` (a local path or ``s3://`` URL), read by DuckDB's delta extension."""
    from harness.tool_cache import delta_reader_python

    request: dict[str, object] = {"table": table}
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
            [str(delta_reader_python()), "-c", _SCRIPT, json.dumps(request)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            msg = f"DuckDB's delta reader failed: {result.stderr.strip()[-2000:]}"
            raise RuntimeError(msg)
        return pq.read_table(request["out"])
