"""``headwater maintain`` on Iceberg tables and their tombstone tables, through the real CLI.

An SCD1 table written merge-on-read (position deletes) and an SCD2 table (copy-on-write) get
a random change stream with deletes, a truncate, late and duplicated changes, in small batches
through the loader's own call (``format.write_batch`` with the table's merge-on-read setting):
small files, delete files, a manifest per batch, a snapshot per batch, and replaced files on
disk. One ``headwater maintain`` pass (retention 0, floor lowered) must then compact every
table and side table, fold the deletes, expire the old snapshots and delete every file no
remaining snapshot references, and each table must read the same before and after by three
readers (pyiceberg's scan, Headwater's read and DuckDB's own iceberg extension); the SCD1 table
equals the stream's latest image per key. ``status`` shows the maintained shape, and loading
goes on afterwards (the recorded key and the batch marker survive expiry).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from harness.auto_cdc_examples import KEYS, batches, expected_scd1, stream
from harness.iceberg_reader import three_reads

from core.config import ProjectConfig, load_config
from warehouse_loader.formats import format_of, merge_on_read
from warehouse_loader.iceberg.maintenance import delete_files, referenced_files
from warehouse_loader.iceberg.scan import TableFiles
from warehouse_loader.iceberg.table_ref import IcebergTableRef
from warehouse_loader.load_job import table_path

pytestmark = pytest.mark.integration

TABLES = {"users": "scd1", "users_hist": "scd2"}


def project(tmp_path: Path) -> ProjectConfig:
    body = {
        "project": "ice",
        "warehouse": {
            "format": "iceberg",
            "tables": {
                "users": {"from": "src.public.users", "mode": "scd1", "merge_on_read": True},
                "users_hist": {"from": "src.public.users", "mode": "scd2"},
            },
            "maintenance": {"target_file_size": 1 << 20, "compact_min_small_files": 4, "retention_s": 0},
        },
    }
    (tmp_path / "headwater.yaml").write_text(yaml.safe_dump(body))
    return load_config(tmp_path / "headwater.yaml")


def refs(config: ProjectConfig, name: str) -> tuple[IcebergTableRef, IcebergTableRef]:
    ref = format_of(config, name).ref(table_path(config, name))  # type: ignore[attr-defined]  # IcebergFormat
    return ref, ref.tombstones


def load(config: ProjectConfig, events: list[tuple[Any, ...]], first_batch: int) -> None:
    """Every table gets the batches as the loader commits them (its format, its merge-on-read setting)."""
    for name in TABLES:
        fmt, where = format_of(config, name), table_path(config, name)
        for n, batch in enumerate(batches(events, size=20), start=first_batch):
            fmt.write_batch(
                where,
                batch,
                table=name,
                batch_id=n,
                keys=KEYS,
                config=config.warehouse.tables[name],
                merge_on_read=merge_on_read(config, name),
            )


def on_disk(ref: IcebergTableRef) -> set[str]:
    """Every file under the table's ``data/`` and ``metadata/`` (not its side table's)."""
    root = Path(ref.location.uri)
    return {str(p).lstrip("/") for sub in ("data", "metadata") for p in (root / sub).rglob("*") if p.is_file()}


def headwater(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEADWATER_RETENTION_FLOOR_S": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "headwater", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_headwater_maintain_compacts_and_expires_iceberg_tables_and_keeps_their_rows(tmp_path: Path) -> None:
    config = project(tmp_path)
    events = stream(seed=34, count=400, keys=80)
    load(config, events, first_batch=0)
    tables = {}
    for name in TABLES:
        main, side = refs(config, name)
        tables[name], tables[f"{name}/_hw_tombstones"] = main, side
    before: dict[str, list[list[dict[str, Any]]]] = {}
    for label, ref in tables.items():
        reads = three_reads(ref)
        assert reads[0] == reads[1] == reads[2], label  # three readers agree before maintenance too
        before[label] = reads
    users, _ = refs(config, "users")
    loaded = users.load()
    assert loaded is not None and delete_files(loaded), "merge-on-read batches wrote position deletes"
    assert sorted((r["userId"], r["name"], r["city"]) for r in before["users"][0]) == expected_scd1(events)

    result = headwater(tmp_path, "maintain")
    said = {
        line.split(": ", 1)[0]: line.split(": ", 1)[1]
        for line in (result.stdout + result.stderr).splitlines()
        if ": " in line
    }
    for label in ("users", "users/_hw_tombstones", "users_hist"):  # a snapshot and small files per batch
        assert said[label].startswith("compacted ") and "vacuumed " in said[label], said
    # Each commit merged the manifests (issue 34): a checkpoint only where compaction left a manifest
    # of removed files alone (the position deletes it folded).
    assert "checkpointed" in said["users"] and "checkpointed" not in said["users/_hw_tombstones"], said
    # The SCD2 table's tombstones: one append (the stream's truncate), one file: nothing to do.
    assert said["users_hist/_hw_tombstones"] == "nothing to do", said

    for label, ref in tables.items():
        assert three_reads(ref) == before[label], label  # the same rows, by every reader
        table = ref.load()
        assert table is not None
        # Expired: the compaction snapshot (current at the pass's cutoff) and the checkpoint after it.
        assert len(table.snapshots()) <= 2, label
        files = TableFiles.of(table)
        assert not delete_files(table) and len(files.files) <= 1, label  # compacted, deletes folded
        manifests = table.current_snapshot().manifests(table.io)  # type: ignore[union-attr]
        assert len(manifests) <= 1, label  # the checkpoint: one manifest per content
        # Every file left is one a remaining snapshot or the metadata log references, and each is there.
        assert on_disk(ref) == referenced_files(table), label

    status = orjson.loads(headwater(tmp_path, "status", "--json").stdout)
    shown = {row["table"]: row for row in status["tables"]}
    for name in TABLES:
        assert shown[name]["files"] <= 1 and shown[name]["dirty_ratio"] == 0.0, shown[name]
        assert shown[name]["commits_since_checkpoint"] == 0 and shown[name]["deleted_rows"] == 0, shown[name]
        assert {"last_compaction", "last_vacuum"} <= set(shown[name]), shown[name]
    assert "last_checkpoint" in shown["users"]  # copy-on-write commits left nothing to fold (issue 34)

    # Loading goes on after expiry dropped the loader's snapshots: the key and the batch marker held.
    more = [(key, name, city, op, n + 1000) for key, name, city, op, n in stream(seed=35, count=100, keys=80)]
    more = [event for event in more if event[3] != "TRUNCATE"]  # keep the first stream's rows in play
    load(config, more, first_batch=100)
    assert format_of(config, "users").loaded_key(table_path(config, "users")) == tuple(KEYS)
    assert sorted((r["userId"], r["name"], r["city"]) for r in three_reads(users)[2]) == expected_scd1(events + more)
