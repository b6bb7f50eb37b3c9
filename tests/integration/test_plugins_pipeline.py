"""The plug-in points are real: a test-only source kind and table format run the whole pipeline through the CLI.

``harness.plugins`` registers a ``replay`` source kind (a recorded file of changes, its own
positions, source block and logical-type schema records) and a ``parquet_dir`` table format
(copy-on-write Parquet versions), through the factories' registration hook; nothing outside that
package knows them. ``headwater run --until-caught-up`` captures, loads SCD1 and SCD2 tables,
``query`` and ``status`` read them, and every table equals what the recording says, after a first
run and after a second one over appended changes. Its CLI processes start Spark twice: 71 s at
load 11-14 on 2 cores, 222 s at load 23-29.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parents[1]
COLUMNS = [
    {"name": "id", "logical": {"type": "int64"}, "native": "BIGINT", "key": True},
    {"name": "name", "logical": {"type": "string"}, "native": "VARCHAR(40)", "key": False},
    {
        "name": "price",
        "logical": {
            "type": "string",
            "name": "headwater.data.DecimalString",
            "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        },
        "native": "DECIMAL(10,2)",
        "key": False,
    },
]


def recording(seed: int, lines: int, start: int = 1) -> tuple[list[dict], dict[int, tuple[str, Decimal]]]:
    """Changes of ``items`` (inserts, updates, deletes, re-inserts) and the final rows they leave."""
    rng = random.Random(seed)
    rows: dict[int, tuple[str, Decimal]] = {}
    out = []
    for number in range(start, start + lines):
        key = rng.randrange(40)
        ts_us = 1_760_000_000_000_000 + number * 1_000_000
        if key in rows and rng.random() < 0.25:
            out.append({"table": "public.items", "op": "d", "key": {"id": key}, "ts_us": ts_us})
            del rows[key]
            continue
        name, price = f"item-{key}-{number}", Decimal(rng.randrange(100_000)) / 100
        op = "u" if key in rows else "c"
        after = {"id": key, "name": name, "price": str(price)}
        out.append({"table": "public.items", "op": op, "key": {"id": key}, "after": after, "ts_us": ts_us})
        rows[key] = (name, price)
    return out, rows


def headwater(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEADWATER_PLUGINS": "harness.plugins", "PYTHONPATH": str(TESTS)}
    return subprocess.run(
        [sys.executable, "-m", "headwater", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


def query(config: Path, sql: str) -> list[dict]:
    done = headwater(config, "query", "--format", "json", sql)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def scd1_rows(config: Path) -> dict[int, tuple[str, Decimal]]:
    return {r["id"]: (r["name"], Decimal(str(r["price"]))) for r in query(config, "SELECT * FROM items ORDER BY id")}


@pytest.mark.integration
def test_a_replayed_source_into_parquet_tables_through_the_whole_pipeline(tmp_path: Path) -> None:
    file = tmp_path / "items.jsonl"
    changes, expected = recording(seed=28, lines=300)
    file.write_text("\n".join(json.dumps(line) for line in [{"table": "public.items", "columns": COLUMNS}, *changes]))
    config = tmp_path / "headwater.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "project": "plugged",
                "log": {"partitions": 2},
                "sources": {"rec": {"kind": "replay", "dsn": str(file), "tables": ["public.items"]}},
                "warehouse": {
                    "format": "parquet_dir",
                    "tables": {
                        "items": {"from": "rec.public.items", "mode": "scd1"},
                        "items_hist": {"from": "rec.public.items", "mode": "scd2"},
                    },
                },
            }
        )
    )

    first = headwater(config, "run", "--until-caught-up")
    assert first.returncode == 0, first.stderr[-3000:]
    assert scd1_rows(config) == expected
    # SCD2: one version per upsert, exactly one open version per key alive, closed at its delete.
    upserts = sum(1 for c in changes if c["op"] != "d")
    versions = query(config, 'SELECT id, "__END_AT" IS NULL AS open FROM items_hist')
    assert len(versions) == upserts
    assert sorted(v["id"] for v in versions if v["open"]) == sorted(expected)
    # The table files are the plug-in's own: Parquet versions, no Delta log anywhere.
    warehouse = tmp_path / ".headwater" / "warehouse"
    assert (warehouse / "items" / "_versions").is_dir() and not list(warehouse.rglob("_delta_log"))

    # Appended changes arrive exactly once: the second run resumes after the acknowledged line
    # (nothing of the first recording is loaded twice: one SCD2 version per upsert of both).
    more, _ = recording(seed=29, lines=120, start=len(changes) + 2)
    replayed = dict(expected)
    for change in more:
        if change["op"] == "d":
            replayed.pop(change["key"]["id"], None)
        else:
            replayed[change["key"]["id"]] = (change["after"]["name"], Decimal(change["after"]["price"]))
    with file.open("a") as handle:
        handle.write("\n" + "\n".join(json.dumps(line) for line in more))
    second = headwater(config, "run", "--until-caught-up")
    assert second.returncode == 0, second.stderr[-3000:]
    assert scd1_rows(config) == replayed
    versions = query(config, 'SELECT id, "__END_AT" IS NULL AS open FROM items_hist')
    assert len(versions) == upserts + sum(1 for c in more if c["op"] != "d")
    assert sorted(v["id"] for v in versions if v["open"]) == sorted(replayed)

    status = headwater(config, "status", "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    report = json.loads(status.stdout)
    acked = f"line {len(changes) + 1 + len(more)}"
    assert report["sources"] == [{"source": "rec", "kind": "replay", "dsn": str(file), "position": acked}]
    text = headwater(config, "status")
    assert text.returncode == 0 and acked in text.stdout, text.stderr[-3000:]
    tables = {row["table"]: row for row in report["tables"]}
    assert tables["items"]["state"] == "loaded" and tables["items"]["lag"] == 0
