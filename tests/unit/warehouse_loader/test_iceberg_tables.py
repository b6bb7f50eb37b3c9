"""What only Iceberg tables have: the snapshot marker, catalog races, schema changes by field ID.

The SCD semantics of the Iceberg writer are checked with the Delta writer's own suites
(``test_table_writer.py``, ``test_auto_cdc_options.py``, parametrised on the format); these
cases are Iceberg's commit protocol. An embedded SQLite catalog in tmp_path: no service.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from harness.auto_cdc_examples import DOC_FEED, KEYS, changes

from core.warehouse_config import TableConfig
from warehouse_loader.errors import CommitConflictError, SchemaMismatchError, TypeChangeRefusedError
from warehouse_loader.iceberg import writer
from warehouse_loader.iceberg.catalog import (
    CatalogConfigError,
    CatalogSpec,
    check_rest,
    embedded_catalog,
    file_io_properties,
)
from warehouse_loader.iceberg.commit import BATCH_SUMMARY, TABLE_SUMMARY, read_files, recorded_key
from warehouse_loader.iceberg.format import IcebergFormat
from warehouse_loader.iceberg.scan import TableFiles, UnsupportedTableError
from warehouse_loader.iceberg.schema import drop_column, rename_column
from warehouse_loader.iceberg.table_ref import IcebergTableRef
from warehouse_loader.location import TableLocation
from warehouse_loader.schema_evolution import TableChanges

SCD1 = TableConfig.model_validate({"from": "users_feed", "mode": "scd1"})


def table(tmp_path: Path, name: str = "users") -> IcebergTableRef:
    return IcebergTableRef(embedded_catalog(tmp_path), TableLocation(str(tmp_path / "warehouse")), name)


def rows(ref: IcebergTableRef) -> list[tuple[Any, ...]]:
    loaded = ref.load()
    assert loaded is not None
    files = TableFiles.of(loaded)
    return sorted((r["userId"], r["name"], r["city"]) for r in read_files(ref, files, list(files.files)).to_pylist())


def write(ref: IcebergTableRef, batch: pa.Table, batch_id: int, app: str = "users") -> writer.WriteResult:
    return writer.write_batch(ref, batch, table=app, batch_id=batch_id, keys=KEYS, config=SCD1)


def test_each_batch_is_one_snapshot_carrying_table_and_batch_id(tmp_path: Path) -> None:
    ref = table(tmp_path)
    for batch_id, (start, end) in enumerate(((0, 4), (4, 6), (6, 8))):
        write(ref, changes(DOC_FEED[start:end]), batch_id)
    loaded = ref.load()
    assert loaded is not None
    marks = [(s.summary.additional_properties[TABLE_SUMMARY], s.summary[BATCH_SUMMARY]) for s in loaded.snapshots()]
    assert marks == [("users", "0"), ("users", "1"), ("users", "2")]
    assert recorded_key(loaded) == ("userId",)
    assert loaded.properties["commit.retry.num-retries"] == "0"


def test_a_commit_that_loses_the_race_is_replanned_on_the_winners_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer commits the same key between our read of the table and our commit."""
    ref = table(tmp_path)
    write(ref, changes([(1, "seed", "c", "INSERT", 1)]), 0, app="seed")
    real_files_where = writer.files_where
    events: list[str] = []

    def read_then_lose(*args: Any, **kwargs: Any) -> Any:
        found = real_files_where(*args, **kwargs)
        if "raced" not in events:
            events.append("raced")
            write(ref, changes([(2, "other", "c", "UPDATE", 2)]), 0, app="other")  # takes the next snapshot
        return found

    real_scd1 = writer.write_scd1

    def counting(*args: Any, **kwargs: Any) -> Any:
        try:
            return real_scd1(*args, **kwargs)
        except CommitConflictError:
            events.append("conflict")
            raise

    monkeypatch.setattr(writer, "files_where", read_then_lose)
    monkeypatch.setattr(writer, "write_scd1", counting)
    result = write(ref, changes([(2, "mine", "c", "UPDATE", 3)]), 0, app="mine")
    assert events == ["raced", "conflict"], events  # lost once, re-planned on the winner's snapshot
    assert not result.skipped
    assert rows(ref) == [(1, "seed", "c"), (2, "mine", "c")]  # one row per key, newest wins
    loaded = ref.load()
    assert loaded is not None and len(loaded.snapshots()) == 3  # seed, other, mine: nothing committed twice


def test_widening_and_adding_columns_are_metadata_changes(tmp_path: Path) -> None:
    ref = table(tmp_path)
    narrow = changes([(1, "a", "x", "INSERT", 1)])
    narrow = narrow.set_column(0, "userId", narrow.column("userId").cast(pa.int32()))
    write(ref, narrow, 0)
    before = ref.load()
    assert before is not None
    first_files = set(TableFiles.of(before).files)
    wide = changes([(2, "b", "y", "INSERT", 2)]).append_column("email", pa.array(["b@example.com"]))
    write(ref, wide, 1)
    after = ref.load()
    assert after is not None
    assert str(after.schema().find_field("userId").field_type) == "long"
    assert after.schema().find_field("userId").field_id == before.schema().find_field("userId").field_id
    # Key 2 touched no file of key 1: the int file is still there, read as long.
    assert first_files <= set(TableFiles.of(after).files)
    assert rows(ref) == [(1, "a", "x"), (2, "b", "y")]


def test_rename_and_drop_keep_every_file_readable_by_field_id(tmp_path: Path) -> None:
    ref = table(tmp_path)
    write(ref, changes([(1, "a", "x", "INSERT", 1)]).append_column("zip", pa.array(["111"])), 0)
    loaded = ref.load()
    assert loaded is not None
    with loaded.transaction() as tx:
        rename_column(tx, "city", "town")
        drop_column(tx, "zip")
    renamed = ref.load()
    assert renamed is not None
    files = TableFiles.of(renamed)
    got = read_files(ref, files, list(files.files)).to_pylist()
    assert [(r["userId"], r["town"]) for r in got] == [(1, "x")] and "zip" not in got[0]


def test_an_incompatible_type_writes_nothing(tmp_path: Path) -> None:
    ref = table(tmp_path)
    write(ref, changes([(1, "a", "x", "INSERT", 1)]), 0)
    loaded = ref.load()
    assert loaded is not None
    bad = changes([(2, "b", "y", "INSERT", 2)]).set_column(2, "city", pa.array([42], pa.int64()))
    with pytest.raises(SchemaMismatchError, match="'city'"):
        write(ref, bad, 1)
    again = ref.load()
    assert again is not None and again.metadata_location == loaded.metadata_location


def test_a_table_with_equality_deletes_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = table(tmp_path)
    write(ref, changes([(1, "a", "x", "INSERT", 1)]), 0)
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.table import FileScanTask
    from pyiceberg.typedef import Record

    equality = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path="file:///elsewhere/eq-deletes.parquet",
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=1,
        file_size_in_bytes=1,
        equality_ids=[1],
    )
    real = FileScanTask.__init__

    def with_deletes(self: Any, data_file: Any, delete_files: Any = None, **kwargs: Any) -> None:
        real(self, data_file, {equality}, **kwargs)  # as if another engine wrote equality deletes

    monkeypatch.setattr(FileScanTask, "__init__", with_deletes)
    with pytest.raises(UnsupportedTableError, match="equality delete files") as caught:
        write(ref, changes([(2, "b", "y", "INSERT", 2)]), 1)
    assert "\n" not in str(caught.value)


def test_catalog_settings_are_checked_and_storage_options_mapped(tmp_path: Path) -> None:
    with pytest.raises(CatalogConfigError, match="http"):
        check_rest(CatalogSpec("rest", "thrift://metastore:9083"))
    with pytest.raises(CatalogConfigError, match="client id"):
        check_rest(CatalogSpec("rest", "https://polaris.example/api/catalog", properties=(("credential", "x"),)))
    spec = CatalogSpec("sql", "postgresql://hw:S3cret@db.example:5432/catalog")
    assert "S3cret" not in str(spec) and "S3cret" not in repr(spec)
    s3 = TableLocation(
        "s3://bucket/wh",
        (("AWS_ENDPOINT_URL", "http://127.0.0.1:9"), ("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")),
    )
    io = file_io_properties(s3)
    assert io["s3.endpoint"] == "http://127.0.0.1:9" and io["s3.access-key-id"] == "k"
    assert io["s3.connect-timeout"] == "5.0"  # the fail-fast default the Delta path uses
    assert file_io_properties(TableLocation(str(tmp_path))) == {}


def test_compaction_checkpoint_expiry_and_orphan_removal_keep_every_row_and_the_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from warehouse_loader.iceberg import row_delta
    from warehouse_loader.iceberg.commit import committed_batch
    from warehouse_loader.iceberg.maintenance import IcebergMaintainer, referenced_files

    # Commits that merge no manifest (every one counts as large): the checkpoint has something to fold.
    monkeypatch.setattr(row_delta, "MERGE_BELOW_BYTES", 0)
    ref = table(tmp_path)
    for batch_id in range(6):  # six batches of new keys: six small files
        write(ref, changes([(batch_id, f"n{batch_id}", "c", "INSERT", batch_id + 1)]), batch_id)
    before = rows(ref)
    maintainer = IcebergMaintainer(ref)
    shape = maintainer.shape(small_below=1 << 20)
    assert shape is not None and (shape.files, shape.small_files, shape.rows, shape.deleted_rows) == (6, 6, 6, 0)
    assert shape.commits_since_checkpoint == 5  # six appends: six manifests where one would do
    removed, added, written = maintainer.compact(64 << 20, 1 << 20, 0.1)
    compacted = ref.load()
    assert compacted is not None and recorded_key(compacted) == ("userId",)
    (live,) = TableFiles.of(compacted).files.values()
    assert (removed, added, written) == (6, 1, live.file_size_in_bytes)
    assert rows(ref) == before
    # The checkpoint: one manifest lists the one live file; no row changes, the key is carried.
    assert maintainer.checkpoint() and not maintainer.checkpoint()  # the second has nothing to fold
    checkpointed = ref.load()
    assert checkpointed is not None and checkpointed.current_snapshot() is not None
    assert len(checkpointed.current_snapshot().manifests(checkpointed.io)) == 1  # type: ignore[union-attr]
    assert rows(ref) == before and recorded_key(checkpointed) == ("userId",)
    data = tmp_path / "warehouse" / "users" / "data"
    assert len(list(data.iterdir())) == 7  # the six small files are still on disk
    assert maintainer.expire(3600.0) == (0, 0, 0)  # everything is younger than the retention
    time.sleep(0.05)
    files, freed, expired = maintainer.expire(0.0)
    kept = ref.load()
    # The newest snapshot before the cutoff is the current one: every other one expires.
    assert kept is not None and expired == 7 and len(kept.snapshots()) == 1 and recorded_key(kept) == ("userId",)
    assert files >= 6 and freed > 0 and len(list(data.iterdir())) == 1
    assert rows(ref) == before and committed_batch(ref.load(), "users") == 5
    assert all(Path("/" + p).exists() for p in referenced_files(kept))
    # The marker still holds after maintenance: a replay of batch 5 is skipped.
    assert write(ref, changes([(5, "again", "c", "UPDATE", 99)]), 5).skipped


def test_compaction_folds_only_heavy_deletes_and_carries_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Merge-on-read: a file with a share of rows removed is rewritten; the other files' deletes move to one file."""
    from warehouse_loader.iceberg import row_delta
    from warehouse_loader.iceberg.maintenance import IcebergMaintainer, delete_files

    monkeypatch.setattr(writer, "MERGE_ON_READ_MAX_SHARE", float("inf"))
    monkeypatch.setattr(row_delta, "MERGE_BELOW_BYTES", 0)  # no manifest merged: the checkpoint folds them
    ref = table(tmp_path)

    def mor(batch: pa.Table, batch_id: int) -> None:
        writer.write_batch(ref, batch, table="users", batch_id=batch_id, keys=KEYS, config=SCD1, merge_on_read=True)

    mor(changes([(k, f"a{k}", "x", "INSERT", k) for k in range(100)]), 0)  # file A: keys 0-99
    mor(changes([(k, f"b{k}", "y", "INSERT", k) for k in range(100, 110)]), 1)  # file B: keys 100-109
    mor(changes([(k, f"u{k}", "z", "UPDATE", 1000 + k) for k in (1, 2, 100, 101, 102, 103)]), 2)
    mor(changes([(3, None, None, "DELETE", 2000)]), 3)
    before = rows(ref)
    maintainer = IcebergMaintainer(ref)
    shape = maintainer.shape(small_below=1)  # no file is small: only removed rows count
    assert shape is not None and shape.deleted_rows == 7 and shape.rows == 116
    loaded = ref.load()
    assert loaded is not None and len(delete_files(loaded)) == 2
    # B lost 4 of its 10 rows (40 %), A 3 of its 100 (3 %): at a 10 % purge share only B is rewritten.
    removed, added, written = maintainer.compact(64 << 20, 1, 0.1)
    assert (removed, added) == (3, 2) and written > 0  # B and both delete files; B's rows and A's deletes
    after = ref.load()
    assert after is not None
    files = TableFiles.of(after)
    assert len(delete_files(after)) == 1 and rows(ref) == before
    shape = maintainer.shape(small_below=1)
    assert shape is not None and shape.deleted_rows == 3 and shape.rows == 116 - 4
    assert len(files.files) == 3  # A, the updated rows' file, B's live rows
    # The checkpoint keeps the carried deletes applying to A (same sequence numbers): same rows.
    assert maintainer.checkpoint()
    checkpointed = ref.load()
    assert checkpointed is not None and checkpointed.current_snapshot() is not None
    manifests = checkpointed.current_snapshot().manifests(checkpointed.io)  # type: ignore[union-attr]
    assert sorted(m.content.name for m in manifests) == ["DATA", "DELETES"]
    assert rows(ref) == before
    by_pyiceberg = checkpointed.scan().to_arrow().to_pylist()  # pyiceberg applies the deletes itself
    assert sorted((r["userId"], r["name"], r["city"]) for r in by_pyiceberg) == before


def test_nested_columns_read_back_whole(tmp_path: Path) -> None:
    """File statistics count only leaf fields: a list or struct column must still be read (not taken as absent)."""
    ref = table(tmp_path)
    batch = changes([(1, "a", "x", "INSERT", 1), (2, "b", "y", "INSERT", 2)])
    batch = batch.append_column("nums", pa.array([[1, None, 3], None], pa.list_(pa.int32())))
    batch = batch.append_column("geo", pa.array([{"lat": 1.5, "tags": ["a"]}, None]))
    write(ref, batch, 0)
    loaded = ref.load()
    assert loaded is not None
    files = TableFiles.of(loaded)
    got = {r["userId"]: (r["nums"], r["geo"]) for r in read_files(ref, files, list(files.files)).to_pylist()}
    assert got == {1: ([1, None, 3], {"lat": 1.5, "tags": ["a"]}), 2: (None, None)}


def test_the_format_through_the_interface(tmp_path: Path) -> None:
    from core.config import parse_config
    from warehouse_loader.formats import format_of
    from warehouse_loader.load_job import table_path

    config = parse_config(
        {
            "project": "p",
            "home": str(tmp_path / "home"),
            "warehouse": {"format": "iceberg", "tables": {"users": {"from": "f"}}},
        },
        tmp_path / "headwater.yaml",
    )
    fmt = format_of(config, "users")
    location = table_path(config, "users")
    assert fmt.name == "iceberg" and not fmt.exists(location) and fmt.open(location) is None
    for batch_id, (start, end) in enumerate(((0, 4), (4, 6), (6, 8))):
        fmt.write_batch(
            location, changes(DOC_FEED[start:end]), table="users", batch_id=batch_id, keys=KEYS, config=SCD1
        )
    stored = fmt.open(location)
    assert stored is not None and fmt.exists(location)
    assert stored.version() == 3 and [h["version"] for h in stored.history(2)] == [3, 2]
    assert stored.history(1)[0]["headwater.batch_id"] == "2" and stored.size_bytes() > 0
    assert fmt.committed_batch(location, "users") == 2 and fmt.loaded_key(location) == ("userId",)
    side = fmt.tombstones(location)
    assert side is not None and side.select("SELECT count(*) AS n FROM target").column("n")[0].as_py() == 1
    assert (config.home_dir / "iceberg" / "catalog.db").exists()  # the embedded catalog, under the home
    main, side_maintainer = fmt.maintainer(location), fmt.maintainer(location, tombstones=True)
    shapes = main.shape(1 << 20), side_maintainer.shape(1 << 20)
    assert shapes[0] is not None and shapes[0].version == 3 and shapes[0].files >= 1
    assert shapes[1] is not None and shapes[1].rows == 1  # the tombstone table, not a table named _hw_tombstones
    assert fmt.maintainer(side.location).shape(1 << 20) is None  # its directory alone names no table
    assert main.compact(64 << 20, 1 << 20, 0.1)[0] >= 0 and fmt.committed_batch(location, "users") == 2
    fmt.remove(location)
    assert not fmt.exists(location) and fmt.tombstones(location) is None and not Path(location.uri).exists()


def test_evolve_renames_and_promotes_in_metadata_and_refuses_a_scale_change(tmp_path: Path) -> None:
    """TableFormat.evolve on Iceberg (issue 27): metadata only, tombstones follow a renamed key; no scale change."""
    fmt = IcebergFormat()
    where = TableLocation(str(tmp_path / "warehouse" / "users"))
    batch = changes([(1, "a", "x", "INSERT", 1), (2, "b", "y", "INSERT", 2), (2, "b", "y", "DELETE", 3)])
    batch = batch.append_column("qty", pa.array([5, 6, 6], pa.int32()))
    batch = batch.append_column("price", pa.array([Decimal("1.25")] * 3, pa.decimal128(8, 2)))
    fmt.write_batch(where, batch, table="users", batch_id=0, keys=KEYS, config=SCD1)
    before = fmt.open(where)
    assert before is not None
    files = set(before.files.files)
    renames = (("city", "town"), ("userId", "user_id"))
    assert fmt.evolve(where, TableChanges(renames, {"qty": pa.int64()}), keys=("user_id",))
    after = fmt.open(where)
    assert after is not None
    assert set(after.files.files) == files  # metadata only
    assert after.schema().field("qty").type == pa.int64()
    got = after.select("SELECT user_id, town, qty, price FROM target").to_pylist()
    assert got == [{"user_id": 1, "town": "x", "qty": 5, "price": Decimal("1.25")}]
    side = fmt.tombstones(where)
    assert side is not None and "user_id" in side.schema().names and "userId" not in side.schema().names
    assert not fmt.evolve(where, TableChanges(renames, {"qty": pa.int64()}), keys=("user_id",))  # done already
    scale = TableChanges((), {"price": pa.decimal128(14, 4)})
    with pytest.raises(TypeChangeRefusedError) as refused:
        fmt.evolve(where, scale, keys=("user_id",))
    assert str(refused.value) == (
        "table 'users': the source changed column 'price' from decimal(8, 2) to decimal(14, 4), which an Iceberg "
        "table cannot change in place; nothing was written. Rebuild the table with 'headwater reprocess users'"
    )
    unchanged = fmt.open(where)
    assert unchanged is not None and unchanged.schema() == after.schema()


@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
def test_manifests_and_files_stay_bounded_between_maintenance_passes(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: each commit merges the small manifests; the loader compacts once its files pile up.

    Without either, every batch adds a manifest (two, merge-on-read) and a data file (and a
    delete file) that every later plan and query opens. Every snapshot still reads the rows it
    held when it was committed (time travel), and pyiceberg's own scan agrees with Headwater's read.
    """
    from harness.auto_cdc_examples import batches, expected_scd1, stream

    from core.warehouse_config import MaintenanceConfig
    from warehouse_loader.iceberg.maintenance import IcebergMaintainer, delete_files
    from warehouse_loader.maintenance import PiledFiles

    monkeypatch.setattr(writer, "MERGE_ON_READ_MAX_SHARE", float("inf"))  # every update as position deletes
    ref = table(tmp_path)
    settings = MaintenanceConfig()
    piled = PiledFiles(IcebergMaintainer(ref), settings)
    events = stream(seed=3, count=400, keys=200)
    seen: list[tuple[int, list[tuple[Any, ...]]]] = []
    compactions = 0
    for batch_id, batch in enumerate(batches(events, size=10)):
        result = writer.write_batch(
            ref, batch, table="users", batch_id=batch_id, keys=KEYS, config=SCD1, merge_on_read=mode == "merge-on-read"
        )
        compacted = piled.after_commit(result.files) is not None
        compactions += compacted
        loaded = ref.load()
        assert loaded is not None and loaded.current_snapshot() is not None
        manifests = loaded.current_snapshot().manifests(loaded.io)  # type: ignore[union-attr]
        assert len(manifests) <= 2, (batch_id, len(manifests))  # one per content, whatever the batches since a pass
        files = TableFiles.of(loaded)
        live = len(files.files) + len(delete_files(loaded))  # deletes naming a rewritten file still count
        assert compacted or live == result.files  # the count the loader goes by is the table's
        assert live <= settings.compact_min_small_files + 2, (batch_id, live)
        seen.append((loaded.current_snapshot().snapshot_id, rows(ref)))  # type: ignore[union-attr]
    assert seen[-1][1] == expected_scd1(events)
    assert compactions >= 3 if mode == "merge-on-read" else compactions == 0  # copy-on-write rewrites as it goes
    loaded = ref.load()
    assert loaded is not None
    by_pyiceberg = loaded.scan().to_arrow().to_pylist()
    assert sorted((r["userId"], r["name"], r["city"]) for r in by_pyiceberg) == seen[-1][1]
    for snapshot_id, expected in seen:  # nothing an older version needs was dropped
        at = TableFiles.of(loaded, snapshot_id)
        read = read_files(ref, at, list(at.files)).to_pylist()
        assert sorted((r["userId"], r["name"], r["city"]) for r in read) == expected, snapshot_id
