import subprocess
import sys

import orjson
import pyarrow as pa
from deltalake import write_deltalake


def headwater(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "headwater", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def project(tmp_path):
    (tmp_path / "headwater.yaml").write_text(
        "project: p\nwarehouse:\n  tables:\n    customers: {from: shop.public.customers, mode: scd1}\n"
    )
    table = pa.table({"id": [1, 2, 3], "country": ["NZ", "FR", "NZ"]})
    write_deltalake(str(tmp_path / ".headwater" / "warehouse" / "customers"), table)


def test_query_json_is_one_array_of_row_objects(tmp_path):
    project(tmp_path)
    result = headwater(
        "query", "SELECT country, count(*) AS n FROM customers GROUP BY 1 ORDER BY 1", "--format", "json", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert orjson.loads(result.stdout) == [{"country": "FR", "n": 1}, {"country": "NZ", "n": 2}]


def test_query_csv_and_table(tmp_path):
    project(tmp_path)
    csv = headwater("query", "SELECT id FROM customers ORDER BY id", "--format", "csv", cwd=tmp_path)
    assert csv.stdout.splitlines() == ["id", "1", "2", "3"]
    table = headwater("query", "SELECT id FROM customers ORDER BY id", cwd=tmp_path)
    assert "(3 rows)" in table.stdout


def test_unknown_table_is_one_line(tmp_path):
    project(tmp_path)
    result = headwater("query", "SELECT * FROM nope", cwd=tmp_path)
    assert result.returncode == 3  # a permanent error: retrying will not help
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "customers" in lines[0]
