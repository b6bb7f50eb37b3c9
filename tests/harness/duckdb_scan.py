"""DuckDB 1.5.5 with extensions from PyPI wheels, in its own process and venv: the independent table readers.

:mod:`harness.iceberg_reader` (``iceberg_scan``) and :mod:`harness.delta_reader` (``delta_scan``)
run one scan function of an extension in the cached venv's interpreter
(:mod:`harness.tool_cache`), extensions loaded from their files, never downloaded; ``s3://``
tables through a DuckDB S3 secret made from the warehouse's storage options. The rows come
back through a Parquet file (DuckDB writes it, pyarrow reads it): only transport.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
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
for name in request["extensions"]:
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
con.execute(f"COPY (SELECT * FROM {request['scan']}(?)) TO '{request['out']}' (FORMAT parquet)", [request["target"]])
"""


def duckdb_scan(
    python: Path,
    extensions: Sequence[str],
    scan: str,
    target: str,
    storage_options: Mapping[str, str] | None = None,
) -> pa.Table:
    """Every row ``scan(target)`` returns in DuckDB run by ``python`` with ``extensions`` loaded."""
    request: dict[str, object] = {"extensions": list(extensions), "scan": scan, "target": target}
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
            [str(python), "-c", _SCRIPT, json.dumps(request)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            msg = f"DuckDB's {scan} failed: {result.stderr.strip()[-2000:]}"
            raise RuntimeError(msg)
        return pq.read_table(request["out"])
