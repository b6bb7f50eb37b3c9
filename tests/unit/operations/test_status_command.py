"""``headwater status`` and the quality reader on a Delta table a MERGE has rewritten.

Reading such a table through a pyarrow dataset scan aborted the process at exit in most
runs here ("terminate called without an active exception", arrow#34314), after the
command had printed its output. The abort is per process, so each check runs several.
"""

import subprocess
import sys
from datetime import UTC, datetime

import orjson
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

RUNS = 4
FIRST = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
LAST = datetime(2026, 1, 2, 3, 4, 9, 123456, tzinfo=UTC)


def rows(ids, countries, stamp):
    return pa.table(
        {"id": ids, "country": countries, "__hw_commit_ts": pa.array([stamp] * len(ids), pa.timestamp("us", "UTC"))}
    )


def merged_table(tmp_path):
    (tmp_path / "headwater.yaml").write_text(
        "project: p\nwarehouse:\n  tables:\n    customers: {from: shop.public.customers, mode: scd1}\n"
    )
    path = str(tmp_path / ".headwater" / "warehouse" / "customers")
    for start in range(0, 40, 10):
        ids = list(range(start, start + 10))
        write_deltalake(path, rows(ids, ["NZ"] * 10, FIRST), mode="append")
    changes = rows([1, 2, 99], ["FR", "DE", "US"], LAST)
    (
        DeltaTable(path)
        .merge(changes, "s.id = t.id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    return path


def run(*args, cwd):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_status_reports_the_last_commit_and_exits_cleanly(tmp_path):
    merged_table(tmp_path)
    for _ in range(RUNS):
        result = run("-m", "headwater", "status", "--json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        (table,) = orjson.loads(result.stdout)["tables"]
        assert table["state"] == "loaded"
        assert datetime.fromisoformat(table["last_commit"]) == LAST


def test_quality_reader_reads_every_row_and_exits_cleanly(tmp_path):
    path = merged_table(tmp_path)
    script = (
        "import sys; from pathlib import Path; from warehouse_loader.quality import read_table; "
        "f = read_table(Path(sys.argv[1])); print(len(f), sorted(f.loc[f.id < 3, 'country']))"
    )
    for _ in range(RUNS + 2):
        result = run("-c", script, path, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split(maxsplit=1) == ["41", "['DE', 'FR', 'NZ']\n"]


def test_status_reports_a_source_whose_password_variable_is_unset_and_shows_the_rest(tmp_path):
    merged_table(tmp_path)
    config = tmp_path / "headwater.yaml"
    config.write_text(
        config.read_text()
        + "sources:\n  shop:\n    dsn: postgresql://capture:${HW_STATUS_UNSET_PW}@127.0.0.1:1/shop\n"
        + "    tables: [public.customers]\n"
    )
    for as_json in (True, False):
        result = run("-m", "headwater", "status", *(["--json"] if as_json else []), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        if as_json:
            body = orjson.loads(result.stdout)
            (source,) = body["sources"]
            assert "HW_STATUS_UNSET_PW" in source["error"] and "not set" in source["error"]
            assert body["tables"][0]["state"] == "loaded"
        else:
            assert "HW_STATUS_UNSET_PW" in result.stdout and "customers" in result.stdout
