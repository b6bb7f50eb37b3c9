"""Warehouse tables on S3 (``moto_server``): written by the Delta writer, read by every reader.

``warehouse.path: s3://...`` with credentials in ``warehouse.storage_options`` (``${VAR}``):
SCD1 and SCD2 tables are written through :func:`warehouse_loader.delta.writer.write_batch`
and read back by ``headwater query`` (DuckDB over pyarrow's S3 filesystem, no extension),
``status``, ``quality`` (incl. the SCD2 invariants) and Dagster's table metadata. Two
processes merging into one table at the same moment both land every batch (conditional
put + re-planned conflicts). A missing bucket, refused credentials and an endpoint that
does not answer are one line each. No Spark here: the cluster test loads S3 with Spark.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.auto_cdc_examples import DOC_FEED as DOC_INPUT
from harness.auto_cdc_examples import KEYS, changes

from core.config import ProjectConfig, load_config
from log.factory import open_log
from operations.embedded_postgres import free_port
from warehouse_loader.delta.table import delta_exists, open_delta
from warehouse_loader.delta.writer import committed_batch, write_batch
from warehouse_loader.errors import WarehouseStorageError, WarehouseUnreachableError
from warehouse_loader.formats import check_warehouse, format_of
from warehouse_loader.load_job import table_path
from warehouse_loader.location import location_in
from warehouse_loader.query import run_query

pytestmark = pytest.mark.integration

SECRET = "S3-Secret-Never-Shown-4kd"
FEED = "users_feed"


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    from harness.moto import serve

    yield from serve("warehouse")


def project(
    tmp_path: Path, s3: Any, monkeypatch: pytest.MonkeyPatch, prefix: str, fmt: str = "delta", **options: str
) -> ProjectConfig:
    from harness.moto import warehouse_options

    monkeypatch.setenv("HW_S3_SECRET", SECRET)
    storage = warehouse_options(s3, AWS_SECRET_ACCESS_KEY="${HW_S3_SECRET}", **options)
    document = {
        "project": "s3",
        "home": str(tmp_path / "home"),
        "feeds": {FEED: {"from": "src.public.users", "sql": "SELECT * FROM source", "key": list(KEYS)}},
        "warehouse": {
            "format": fmt,
            "path": f"s3://warehouse/{prefix}",
            "storage_options": storage,
            "tables": {"users": {"from": FEED, "mode": "scd1"}, "users_hist": {"from": FEED, "mode": "scd2"}},
        },
        "quality": {"users": [{"expect": "expect_column_values_to_not_be_null", "column": "userId", "blocking": True}]},
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "headwater.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_config(path)


def load_doc_example(config: ProjectConfig) -> None:
    for table in config.warehouse.tables:
        for batch_id, (start, end) in enumerate(((0, 4), (4, 6), (6, 8))):
            format_of(config, table).write_batch(
                table_path(config, table),
                changes(DOC_INPUT[start:end]),
                table=table,
                batch_id=batch_id,
                keys=KEYS,
                config=config.warehouse.tables[table],
            )


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_tables_on_s3_are_read_by_query_status_quality_and_dagster(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unique_name: Any, table_format: str
) -> None:
    from dagster_project.metadata import table_metadata
    from operations.status import table_status
    from warehouse_loader.quality import run_quality

    prefix = unique_name("wh")
    config = project(tmp_path, s3, monkeypatch, prefix, table_format)
    assert SECRET not in repr(config) and SECRET not in str(config.warehouse)
    location = table_path(config, "users")
    assert str(location) == f"s3://warehouse/{prefix}/users" and SECRET not in repr(location)
    check_warehouse(config)
    load_doc_example(config)

    assert format_of(config, "users").committed_batch(location, "users") == 2
    tables = {name: table_path(config, name) for name in config.warehouse.tables}
    formats = {name: format_of(config, name) for name in config.warehouse.tables}
    now = run_query('SELECT "userId", name, city FROM users ORDER BY 1', tables, formats=formats).to_pylist()
    assert [(r["userId"], r["city"]) for r in now] == [
        (124, "Oaxaca"),
        (125, "Guadalajara"),
        (126, "Cancun"),
    ]
    # A string filter over files a MERGE rewrote (string_view) and files written plainly (string).
    hist = run_query(
        "SELECT count(*) AS n FROM users_hist WHERE city = 'Guadalajara' OR name = 'Raul'", tables, formats=formats
    )
    assert hist.column("n")[0].as_py() == 2
    with pytest.raises(Exception, match="file system operations are disabled"):
        run_query("SELECT * FROM read_parquet('s3://warehouse/elsewhere/x.parquet')", tables, formats=formats)

    log = open_log(config)
    try:
        status = {row["table"]: row for row in table_status(config, log)}
        metadata = table_metadata(config, log, "users")
    finally:
        log.close()
    assert status["users"]["state"] == status["users_hist"]["state"] == "loaded"
    assert "last_commit" in status["users_hist"]
    assert metadata["dagster/row_count"] == 3 and metadata["warehouse/path"] == str(location)

    run = run_quality(config, record=False)
    checked = {outcome.table: outcome for outcome in run.tables}
    assert set(checked) == {"users", "users_hist"}  # users_hist: the built-in SCD2 invariants
    assert all(e.success for outcome in run.tables for e in outcome.expectations), run
    assert not (config.home_dir / "warehouse").exists(), "nothing may be written locally"


def lose_the_race_once(monkeypatch: pytest.MonkeyPatch, location: Any, other: Any) -> list[str]:
    """Make the next SCD1 write to ``location`` lose its version: ``other()`` commits right after its read.

    The returned list records ``"raced"`` when ``other`` ran and ``"conflict"`` per attempt that lost.
    """
    from warehouse_loader.delta import writer as delta_writer
    from warehouse_loader.errors import CommitConflictError

    real_open, real_scd1 = delta_writer.take_table, delta_writer.write_scd1
    events: list[str] = []

    def open_then_lose(path: Any) -> Any:
        target = real_open(path)
        if str(path) == str(location) and "raced" not in events:
            events.append("raced")
            other()
        return target

    def counting(*args: Any, **kwargs: Any) -> Any:
        try:
            return real_scd1(*args, **kwargs)
        except CommitConflictError:
            events.append("conflict")
            raise

    monkeypatch.setattr(delta_writer, "take_table", open_then_lose)
    monkeypatch.setattr(delta_writer, "write_scd1", counting)
    return events


def test_a_merge_that_loses_its_version_to_another_writer_is_replanned_and_lands(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unique_name: Any
) -> None:
    """Deterministic: another writer commits the same key between our read of the table and our MERGE.

    (Writers of disjoint keys do not conflict: delta-rs narrows a MERGE's read to the batch's
    keys, ``predicate: "userId" = 2`` in the commit, and both commits stand.)
    """
    config = project(tmp_path, s3, monkeypatch, unique_name("conflict"))
    location = table_path(config, "users")
    settings = config.warehouse.tables["users"]

    def write(key: int, writer: str, at: int) -> Any:
        rows = changes([(key, writer, "c", "UPDATE", at)])
        return write_batch(location, rows, table=writer, batch_id=0, keys=["userId"], config=settings)

    write(1, "seed", 1)
    # A real commit (conditional put on moto) takes the next version.
    events = lose_the_race_once(monkeypatch, location, lambda: write(2, "other", 2))
    result = write(2, "mine", 3)
    assert events == ["raced", "conflict"], events  # lost once, re-planned on the winner's version
    assert not result.skipped
    rows = run_query('SELECT "userId", name FROM users ORDER BY 1', {"users": location}).to_pylist()
    assert rows == [{"userId": 1, "name": "seed"}, {"userId": 2, "name": "mine"}]  # one row per key, newest wins
    assert committed_batch(location, "mine") == committed_batch(location, "other") == 0
    assert open_delta(location).version() == 2  # seed, other, mine: no version written twice


@pytest.mark.parametrize("merge_on_read", [False, True], ids=["delta-rs-merge", "merge-on-read"])
def test_two_writers_racing_on_one_s3_table_both_land_every_batch(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unique_name: Any, merge_on_read: bool
) -> None:
    """Two processes x 12 batches from the same instant: every batch lands once (delta-rs's or our conditional PUT).

    Merge-on-read (deletion vectors from each writer's second batch): a commit conflicts with any
    other commit made since its read (no disjoint-key resolution as delta-rs's), so a batch may
    lose all its attempts to the other writer; it then fails cleanly (``CommitConflictError``,
    nothing of it committed) and is written again, as the loader replays a failed batch. Either
    way no batch is committed twice: each ``(writer, batch)`` app transaction is in exactly one entry.
    """
    import orjson

    from warehouse_loader.delta.table_files import S3Files

    config = project(tmp_path, s3, monkeypatch, unique_name("race"))
    location = table_path(config, "users")
    batches = 12
    script = textwrap.dedent(
        f"""
        import json, sys, time
        from core.config import load_config
        from warehouse_loader.delta import merge_on_read, writer as delta_writer
        from warehouse_loader.errors import CommitConflictError
        from warehouse_loader.load_job import table_path
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from harness.auto_cdc_examples import changes

        writer, start_at = int(sys.argv[1]), float(sys.argv[2])
        config = load_config({str(config.config_path)!r})
        conflicts = failed = 0
        real = delta_writer.write_scd1

        def counting(*args, **kwargs):
            global conflicts
            try:
                return real(*args, **kwargs)
            except CommitConflictError:
                conflicts += 1
                raise

        delta_writer.write_scd1 = counting
        merge_on_read.MIN_TABLE_BYTES = 0
        while time.time() < start_at:
            time.sleep(0.001)
        for batch in range({batches}):
            key = writer * 1000 + batch
            # a new key, and the key of the writer's previous batch updated (a deletion vector when merged on read)
            rows = changes(
                [(key, f"w{{writer}}", f"b{{batch}}", "INSERT", batch + 1)]
                + ([(key - 1, f"w{{writer}}", f"u{{batch}}", "UPDATE", batch + 1)] if batch else [])
            )
            while True:
                try:
                    delta_writer.write_batch(
                        table_path(config, "users"), rows, table=f"writer{{writer}}", batch_id=batch,
                        keys=["userId"], config=config.warehouse.tables["users"], merge_on_read={merge_on_read},
                    )
                    break
                except CommitConflictError:  # every attempt lost: the batch failed cleanly; replay it
                    failed += 1
        print(json.dumps({{"conflicts": conflicts, "failed": failed}}))
        """
    )
    start_at = time.time() + 8  # both processes have imported deltalake by then
    env = {"HW_S3_SECRET": SECRET, "PATH": "/usr/bin:/bin"}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(n), str(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for n in (1, 2)
    ]
    outputs = [w.communicate(timeout=300) for w in writers]
    for writer, (_, err) in zip(writers, outputs, strict=True):
        assert writer.returncode == 0, err.decode()[-3000:]
    counts = [json.loads(out.decode().splitlines()[-1]) for out, _ in outputs]
    conflicts, failed = sum(c["conflicts"] for c in counts), sum(c["failed"] for c in counts)
    found = run_query('SELECT "userId", city FROM users ORDER BY 1', {"users": location}).to_pylist()
    assert found == [
        {"userId": w * 1000 + b, "city": f"u{b + 1}" if b < batches - 1 else f"b{b}"}
        for w in (1, 2)
        for b in range(batches)
    ]
    assert committed_batch(location, "writer1") == committed_batch(location, "writer2") == batches - 1
    files, transactions = S3Files(location), []
    for version in range(open_delta(location).version() + 1):
        entry = files.read(f"_delta_log/{version:020d}.json").splitlines()
        transactions += [(a["txn"]["appId"], a["txn"]["version"]) for a in map(orjson.loads, entry) if "txn" in a]
    assert sorted(transactions) == [(f"writer{w}", b) for w in (1, 2) for b in range(batches)]  # each exactly once
    print(
        f"\n2 writers x {batches} MERGEs on one S3 table ({'merge-on-read' if merge_on_read else 'delta-rs'}): "
        f"{conflicts} commit conflicts re-planned and retried, {failed} batches failed cleanly and replayed"
    )


def test_storage_problems_are_one_line_and_fail_fast(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unique_name: Any
) -> None:
    from harness.moto import StrictMotoS3

    missing = project(tmp_path / "a", s3, monkeypatch, "x").model_copy(deep=True)
    missing = missing.model_copy(
        update={"warehouse": missing.warehouse.model_copy(update={"path": "s3://nobucket/wh"})}
    )
    with pytest.raises(WarehouseStorageError, match="bucket 'nobucket' does not exist; create it"):
        check_warehouse(missing)

    strict = StrictMotoS3().start()
    try:
        refused = project(tmp_path / "b", s3, monkeypatch, "x", AWS_ENDPOINT_URL=strict.endpoint)
        with pytest.raises(WarehouseStorageError, match=r"refused the credentials \(InvalidAccessKeyId\)") as caught:
            check_warehouse(refused)
        assert SECRET not in str(caught.value)
    finally:
        strict.stop()

    down = project(tmp_path / "c", s3, monkeypatch, "x", AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}")
    started = time.monotonic()
    with pytest.raises(WarehouseUnreachableError, match=r"cannot reach the object store at http://127\.0\.0\.1"):
        check_warehouse(down)
    assert time.monotonic() - started < 60  # object_store's defaults would retry for minutes

    config = project(tmp_path / "d", s3, monkeypatch, unique_name("rm"))
    load_doc_example(config)
    old = location_in(config, str(table_path(config, "users")))
    assert delta_exists(old)
    old.remove()  # what reprocess --drop-old does to a previous version
    assert not delta_exists(old) and delta_exists(table_path(config, "users_hist"))


# --------------------------------------------------------------------------- merge-on-read on S3 (issue 34)


def latest_per_key(batches: list[Any]) -> list[tuple[Any, ...]]:
    """The SCD1 table the change stream implies: per key its highest-sequence change, absent when a delete."""
    newest: dict[int, dict[str, Any]] = {}
    for batch in batches:
        for change in batch.to_pylist():
            kept = newest.get(change["userId"])
            if kept is None or change["__hw_seq"] > kept["__hw_seq"]:
                newest[change["userId"]] = change
    return sorted(((r["userId"], r["name"], r["city"]) for r in newest.values() if r["__hw_op"] != "d"), key=repr)


def three_reads(config: ProjectConfig, table: str) -> dict[str, list[tuple[Any, ...]]]:
    """The table's ``(userId, name, city[, __START_AT, __END_AT])`` rows, sorted, by each reader.

    delta-rs's query engine and DuckDB's delta extension (delta-kernel-rs), which nobody here
    wrote, and ``headwater query`` (Headwater's DuckDB view, its own deletion vector filter).
    """
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder
    from harness.delta_reader import read_delta

    location = table_path(config, table)
    columns = ["userId", "name", "city"] + (["__START_AT", "__END_AT"] if table.endswith("_hist") else [])

    def rows(read: Any) -> list[tuple[Any, ...]]:
        return sorted((tuple(row[c] for c in columns) for row in read.select(columns).to_pylist()), key=repr)

    delta = DeltaTable(location.uri, storage_options=location.storage_options)
    theirs = QueryBuilder().register("t", delta).execute("SELECT * FROM t").read_all()
    tables = {name: table_path(config, name) for name in config.warehouse.tables}
    return {
        "delta-rs": rows(pa.table(theirs)),
        "duckdb delta extension": rows(read_delta(location.uri, location.storage_options)),
        "headwater query": rows(run_query(f"SELECT * FROM {table}", tables)),
    }


def s3_keys(config: ProjectConfig, table: str, under: str) -> set[str]:
    """Names of the objects under ``<table>/<under>/`` in the bucket."""
    import pyarrow.fs as pafs

    fs, root = table_path(config, table).filesystem()
    selector = pafs.FileSelector(f"{root}/{under}", allow_not_found=True)
    return {info.base_name for info in fs.get_file_info(selector) if info.type == pafs.FileType.File}


@pytest.mark.parametrize("mode", ["scd1", "scd2"])
def test_merge_on_read_on_s3_stays_equal_to_the_source_for_every_reader(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unique_name: Any, mode: str
) -> None:
    """Random batches (updates, deletes, re-inserts, late changes) merged on read into an S3 table.

    After every batch the table equals the source (SCD1: the newest change per key; SCD2: the
    history delta-rs's copy-on-write MERGE keeps for the same batches on a local table) as
    delta-rs, DuckDB's delta extension and ``headwater query`` read it. After every batch the
    loader's own check runs (compaction once removed rows are half the table's rows); mid-way a
    maintenance pass runs on S3 (compaction purging deletion vectors, checkpoint, vacuum with no
    retention, deletion vector files no version uses collected), then loading goes on.
    """
    from deltalake import DeltaTable
    from harness.auto_cdc_examples import random_batches

    from operations.maintain import last_runs
    from warehouse_loader import maintenance
    from warehouse_loader.delta import log_entry, merge_on_read
    from warehouse_loader.delta.deletion_vectors import DV_DIR, referenced_files
    from warehouse_loader.delta.maintenance import DeltaMaintainer
    from warehouse_loader.delta.table_files import S3Files, table_files
    from warehouse_loader.load_job import _compact_if_buried

    monkeypatch.setattr(merge_on_read, "MIN_TABLE_BYTES", 0)  # deletion vectors from the second batch on
    monkeypatch.setattr(log_entry, "CHECKPOINT_INTERVAL", 5)  # our commits also write checkpoints on S3
    monkeypatch.setattr(maintenance, "LOOK_AFTER_CHANGES", 1)  # the loader looks after every batch
    monkeypatch.setattr(maintenance, "BURIED_SHARE", 0.2)  # this stream buries 20 % by batch 5, never half (SCD2)
    config = project(tmp_path, s3, monkeypatch, unique_name("mor"))
    table = "users" if mode == "scd1" else "users_hist"
    location = table_path(config, table)
    reference = tmp_path / "copy-on-write"
    assert isinstance(table_files(location), S3Files)
    batches = random_batches(11, 16)
    maintainer = format_of(config, table).maintainer(location)
    buried = maintenance.BuriedRows(maintainer, config.warehouse.maintenance_of(table))
    for batch_id, batch in enumerate(batches):
        settings = config.warehouse.tables[table]
        write_batch(location, batch, table=table, batch_id=batch_id, keys=KEYS, config=settings, merge_on_read=True)
        _compact_if_buried(config, table, buried, changes=batch.num_rows)
        write_batch(reference, batch, table=table, batch_id=batch_id, keys=KEYS, config=settings)
        newest = DeltaTable(location.uri, storage_options=location.storage_options).history(1)[0]
        assert batch_id == 0 or newest.get("engineInfo") == "headwater merge-on-read", newest  # 0 creates it
        if mode == "scd1":
            expected = latest_per_key(batches[: batch_id + 1])
        else:
            versions = DeltaTable(str(reference)).to_pyarrow_table().to_pylist()
            expected = sorted(
                ((r["userId"], r["name"], r["city"], r["__START_AT"], r["__END_AT"]) for r in versions), key=repr
            )
        if batch_id % 3 == 0 or batch_id == len(batches) - 1:  # DuckDB's reader is a process: not every batch
            for reader, rows in three_reads(config, table).items():
                assert rows == expected, f"batch {batch_id}: {reader}"
        if batch_id == 8:
            assert isinstance(maintainer, DeltaMaintainer)
            assert s3_keys(config, table, DV_DIR), "no deletion vector file on S3 yet"
            maintainer.compact(1 << 20, 1 << 16, 0.05)  # (the loader's own may just have left nothing to do)
            assert maintainer.shape(1 << 16).deleted_rows == 0  # the purge left no row behind a vector
            assert maintainer.checkpoint()
            time.sleep(1.1)
            maintainer.expire(0.5)
            dv_files = s3_keys(config, table, DV_DIR)
            assert dv_files == referenced_files(S3Files(location)), "a vector file no version uses was kept"
            for reader, rows in three_reads(config, table).items():
                assert rows == expected, f"after maintenance: {reader}"
    assert s3_keys(config, table, DV_DIR), "no deletion vector file on S3"
    assert "last_compaction" in last_runs(config, table), "the loader never compacted: the case tests less"
    assert committed_batch(location, table) == len(batches) - 1
    assert not (config.home_dir / "warehouse").exists(), "nothing may be written locally"


def test_a_merge_on_read_commit_whose_version_another_writer_took_is_replanned_and_lands(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unique_name: Any
) -> None:
    """Another writer puts ``_delta_log/<N>.json`` between our read of the table and our commit of N.

    Our conditional PUT of N is refused (412): the winner's entry stays as it was written, and
    the batch is planned again on version N and committed as N + 1, so both batches' rows are there.
    """
    import orjson

    from warehouse_loader.delta import merge_on_read
    from warehouse_loader.delta.table_files import S3Files

    monkeypatch.setattr(merge_on_read, "MIN_TABLE_BYTES", 0)
    config = project(tmp_path, s3, monkeypatch, unique_name("morconflict"))
    location = table_path(config, "users")
    settings = config.warehouse.tables["users"]

    def write(rows: list[tuple[Any, ...]], writer: str, batch_id: int = 0) -> Any:
        return write_batch(
            location, changes(rows), table=writer, batch_id=batch_id, keys=KEYS, config=settings, merge_on_read=True
        )

    write([(1, "a", "x", "INSERT", 1), (2, "b", "x", "INSERT", 1), (3, "c", "x", "INSERT", 1)], "seed")
    write([(1, "a2", "y", "UPDATE", 2)], "seed", batch_id=1)  # deletion vectors from here on
    raced_at = open_delta(location).version() + 1
    # A real merge-on-read commit (its own conditional PUT) takes the version.
    events = lose_the_race_once(monkeypatch, location, lambda: write([(2, "other", "z", "UPDATE", 3)], "other"))
    result = write([(2, "mine", "w", "UPDATE", 4), (3, None, None, "DELETE", 4)], "mine")
    assert events == ["raced", "conflict"], events  # lost once, re-planned on the winner's version
    assert not result.skipped and result.version == raced_at + 1

    files = S3Files(location)

    def entry(version: int) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in files.read(f"_delta_log/{version:020d}.json").splitlines()]

    winner, ours = entry(raced_at), entry(raced_at + 1)
    assert [a["txn"]["appId"] for a in winner if "txn" in a] == ["other"]  # the winner's entry, not overwritten
    assert [a["txn"]["appId"] for a in ours if "txn" in a] == ["mine"]
    # Our replanned commit restates the file the winner gave a deletion vector, that vector included.
    removed = {a["remove"]["path"]: a["remove"].get("deletionVector") for a in ours if "remove" in a}
    added = {a["add"]["path"]: a["add"].get("deletionVector") for a in winner if "add" in a}
    assert any(removed.get(path) == vector for path, vector in added.items() if vector), (removed, added)
    expected = [(1, "a2", "y"), (2, "mine", "w")]
    for reader, rows in three_reads(config, "users").items():
        assert rows == expected, reader
    assert committed_batch(location, "other") == committed_batch(location, "mine") == 0


def test_the_conditional_put_creates_once_and_refuses_in_one_line_without_the_secret(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unique_name: Any
) -> None:
    """``S3Files.create`` against moto: put-if-absent, a retried PUT of our own bytes, refused credentials."""
    from harness.moto import StrictMotoS3

    from warehouse_loader.delta.table_files import S3Files
    from warehouse_loader.location import storage_error

    config = project(tmp_path / "a", s3, monkeypatch, unique_name("put"))
    files = S3Files(table_path(config, "users"))
    assert files.create("_delta_log/00000000000000000000.json", b"first\n")
    assert not files.create("_delta_log/00000000000000000000.json", b"second\n")  # 412: nothing written
    assert files.read("_delta_log/00000000000000000000.json") == b"first\n"
    # A PUT that landed but whose answer was lost is retried and finds the key: its own bytes, so a success.
    assert files.create("_delta_log/00000000000000000000.json", b"first\n")

    strict = StrictMotoS3().start()
    try:
        refused = project(tmp_path / "b", s3, monkeypatch, "x", AWS_ENDPOINT_URL=strict.endpoint)
        with pytest.raises(OSError) as caught:
            S3Files(table_path(refused, "users")).create("_delta_log/00000000000000000000.json", b"x")
        error = storage_error(caught.value, table_path(refused, "users"))
        assert isinstance(error, WarehouseStorageError) and "refused the credentials" in str(error), error
        assert SECRET not in str(error) and SECRET not in str(caught.value)
    finally:
        strict.stop()
