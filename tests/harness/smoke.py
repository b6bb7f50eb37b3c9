"""The whole pipeline once: capture, a feed, SCD1 and SCD2 tables, a query (``test_smoke``, ``test_java_versions``).

A source table is snapshotted and streamed (inserts, updates, a delete) by one ``headwater run
--until-caught-up`` (capture, a feed, an SCD1 table from the feed and an SCD2 table from the
raw topic, in one Spark session), and ``headwater query`` must show the warehouse equal to the
source. ``env`` overrides the CLI processes' environment (``JAVA_HOME``: the JVM Spark runs on).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import yaml

from harness.cli import run_headwater


def run_pipeline_once(pg_database: Any, source: str, directory: Path, env: Mapping[str, str] | None = None) -> None:
    """Capture, run and query a small ``people`` table in a project under ``directory``; assert the tables."""
    raw = f"{source}.public.people"
    pg_database.execute("CREATE TABLE people (id int PRIMARY KEY, name text NOT NULL, country text)")
    pg_database.execute("INSERT INTO people SELECT n, 'name ' || n, 'NZ' FROM generate_series(1, 20) n")
    pg_database.execute(f"CREATE PUBLICATION headwater_{source} FOR TABLE people")
    config = directory / "headwater.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "project": "smoke",
                "log": {"partitions": 2},
                "sources": {source: {"dsn": pg_database.dsn, "tables": ["public.people"], "heartbeat_interval_s": 1}},
                "feeds": {
                    "people_clean": {"from": raw, "sql": "SELECT id, upper(name) AS name FROM source", "key": ["id"]}
                },
                "warehouse": {
                    "tables": {
                        "people": {"from": "people_clean", "mode": "scd1"},
                        "people_hist": {"from": raw, "mode": "scd2"},
                    }
                },
            }
        )
    )

    def headwater(*args: str) -> str:
        return run_headwater(config, *args, env=env, timeout=600).stdout

    headwater("capture", "--until-caught-up")  # the snapshot
    pg_database.execute("INSERT INTO people VALUES (21, 'name 21', 'DE')")
    pg_database.execute("UPDATE people SET name = 'renamed', country = 'FR' WHERE id = 1")
    pg_database.execute("DELETE FROM people WHERE id = 2")
    headwater("run", "--until-caught-up")

    def query(sql: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = orjson.loads(headwater("query", sql, "--format", "json"))
        return rows

    expected = [(n, f"NAME {n}") for n in range(3, 22)]
    assert [(r["id"], r["name"]) for r in query("SELECT id, name FROM people ORDER BY id")] == [
        (1, "RENAMED"),
        *expected,
    ]
    history = query(
        'SELECT id, country, "__END_AT" IS NULL AS current FROM people_hist WHERE id <= 2 ORDER BY id, "__START_AT"'
    )
    assert [(r["id"], r["country"], r["current"]) for r in history] == [
        (1, "NZ", False),
        (1, "FR", True),
        (2, "NZ", False),  # deleted: its only version is closed
    ]
