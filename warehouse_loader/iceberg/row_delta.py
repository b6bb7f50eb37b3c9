"""One Iceberg snapshot that adds data files and position-delete files and removes files: a row delta.

pyiceberg 0.12 writes copy-on-write snapshots only (its delete manifests always say
``content: data``). Merge-on-read needs a snapshot that adds a *position-delete file*
(``file_path``, ``pos`` of rows no longer live, Iceberg spec v2) in a delete manifest, next to
the data file holding the rows' new versions. :class:`RowDelta` is that snapshot producer: it
reuses pyiceberg's manifest, manifest-list, summary and commit machinery (``_SnapshotProducer``)
and writes its own manifests:

* the added data files and the added delete files (``ADDED``; the snapshot's sequence number
  is inherited, so the deletes apply to every older data file they name) each merged with the
  live entries of the parent's small manifests of their content (under
  :data:`MERGE_BELOW_BYTES`: ``EXISTING``, their snapshot and sequence numbers unchanged, or
  ``DELETED`` when removed) into one manifest per content: what Iceberg's
  ``commit.manifest-merge.enabled`` does, here on every commit. Without it every batch adds a
  manifest (two, merge-on-read) that every later plan opens, and query time grows with the
  batches since the last maintenance pass (issue 34); with it a table holds its large
  manifests (folded by maintenance's checkpoint, :mod:`warehouse_loader.iceberg.manifests`)
  plus one small one per content, and a commit rewrites at most that small one;
* each large parent manifest holding a removed file rewritten with that entry ``DELETED`` and
  the others ``EXISTING`` (same content type); the other large manifests kept as they are;
  parent manifests with no live entry dropped.

Removing a data file together with every delete file that names it (compaction) leaves no
dangling delete; a delete file is removed only with all the data files it names.

Position-delete files are written sorted by (``file_path``, ``pos``) with the spec's reserved
field IDs, so any v2 reader (pyiceberg's scan, DuckDB's iceberg extension, Spark, Trino) applies
them; Headwater's own reads apply them too (:mod:`warehouse_loader.iceberg.scan`).
"""

from __future__ import annotations

import functools
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile, ManifestContent, ManifestFile, ManifestWriterV2
    from pyiceberg.table import Transaction
    from pyiceberg.table.update.snapshot import _SnapshotProducer

#: Parent manifests under this many bytes are merged into the commit's own manifest of their content
#: (Iceberg's ``commit.manifest.target-size-bytes`` is 8 MiB, for bins merged every hundredth
#: commit; here the merge runs every second, so the manifest it rewrites stays small).
MERGE_BELOW_BYTES = 256 * 1024
#: The spec's reserved field IDs of a position-delete file's columns.
FILE_PATH_ID = 2147483546
POS_ID = 2147483545
DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={"PARQUET:field_id": str(FILE_PATH_ID)}),
        pa.field("pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": str(POS_ID)}),
    ]
)


def write_position_deletes(tx: Transaction, positions: pa.Table) -> DataFile | None:
    """Write ``positions`` (``file_path``, ``pos``) as one position-delete file of the table; None when empty."""
    from pyiceberg.conversions import to_bytes
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record
    from pyiceberg.types import LongType, StringType

    if positions.num_rows == 0:
        return None
    rows = (
        positions.select(["file_path", "pos"])
        .cast(DELETE_SCHEMA)
        .sort_by([("file_path", "ascending"), ("pos", "ascending")])
    )
    metadata = tx.table_metadata
    provider = tx._table.location_provider()  # the table's own data location rules
    path = provider.new_data_location(f"delete-{uuid.uuid4()}.parquet")
    output = tx._table.io.new_output(path)
    with output.create(overwrite=True) as stream:
        pq.write_table(rows, stream, compression="zstd")
    paths, pos = rows.column("file_path"), rows.column("pos")
    return DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=rows.num_rows,
        file_size_in_bytes=len(output),
        lower_bounds={
            FILE_PATH_ID: to_bytes(StringType(), paths[0].as_py()),
            POS_ID: to_bytes(LongType(), min(pos.to_pylist())),
        },
        upper_bounds={
            FILE_PATH_ID: to_bytes(StringType(), paths[-1].as_py()),
            POS_ID: to_bytes(LongType(), max(pos.to_pylist())),
        },
        spec_id=metadata.default_spec_id,
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
    )


@functools.cache
def _delete_manifest_writer() -> type[ManifestWriterV2]:
    from pyiceberg.manifest import ManifestContent, ManifestWriterV2

    class _DeleteManifestWriter(ManifestWriterV2):  # pyiceberg's v2 writer always says "data"
        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    return _DeleteManifestWriter


def manifest_writer(producer: _SnapshotProducer[Any], content: ManifestContent, spec_id: int) -> ManifestWriterV2:
    """A v2 manifest writer of ``producer``'s snapshot for ``content`` (data or deletes), partition spec ``spec_id``."""
    from pyiceberg.manifest import ManifestContent, ManifestWriterV2

    kind = _delete_manifest_writer() if content == ManifestContent.DELETES else ManifestWriterV2
    return kind(
        producer.spec(spec_id),
        producer.schema(),
        producer.new_manifest_output(),
        producer.snapshot_id,
        producer._compression,  # the table's own Avro compression, as pyiceberg's producers write
    )


def row_delta(
    tx: Transaction,
    *,
    added: Sequence[DataFile] = (),
    deletes: Sequence[DataFile] = (),
    removed: Sequence[DataFile] = (),
    properties: dict[str, str],
) -> None:
    """Stage one snapshot in ``tx``: ``added`` data files, ``deletes`` position-delete files, ``removed`` files gone."""
    from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntry, ManifestEntryStatus
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _SnapshotProducer

    gone = set(removed)

    class _RowDelta(_SnapshotProducer["_RowDelta"]):
        def _restated(self, entry: ManifestEntry) -> ManifestEntry:
            """A live parent entry as this snapshot lists it: ``DELETED`` when removed, else ``EXISTING``."""
            deleted = entry.data_file in gone
            return ManifestEntry.from_args(
                status=ManifestEntryStatus.DELETED if deleted else ManifestEntryStatus.EXISTING,
                snapshot_id=self._snapshot_id if deleted else entry.snapshot_id,
                sequence_number=entry.sequence_number,
                file_sequence_number=entry.file_sequence_number,
                data_file=entry.data_file,
            )

        def _written(self, content: ManifestContent, spec_id: int, entries: Sequence[ManifestEntry]) -> ManifestFile:
            with manifest_writer(self, content, spec_id) as writer:
                for entry in entries:
                    writer.add_entry(entry)
            return writer.to_manifest_file()

        def _manifests(self) -> list[ManifestFile]:
            spec_id = self._transaction.table_metadata.default_spec_id
            merged: dict[tuple[ManifestContent, int], list[ManifestEntry]] = defaultdict(list)
            for content, files in ((ManifestContent.DATA, added), (ManifestContent.DELETES, deletes)):
                merged[(content, spec_id)].extend(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self._snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=data_file,
                    )
                    for data_file in files
                )
            kept: list[ManifestFile] = []
            parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id or -1)
            for manifest in parent.manifests(self._io) if parent is not None else []:
                entries = manifest.fetch_manifest_entry(self._io, discard_deleted=True)
                if not entries:
                    continue  # only files earlier snapshots removed: nothing live to list again
                group = (manifest.content, manifest.partition_spec_id)
                if manifest.manifest_length < MERGE_BELOW_BYTES:
                    merged[group].extend(self._restated(entry) for entry in entries)
                elif any(entry.data_file in gone for entry in entries):
                    kept.append(self._written(*group, [self._restated(entry) for entry in entries]))
                else:
                    kept.append(manifest)
            return [*(self._written(*group, entries) for group, entries in merged.items() if entries), *kept]

        def _existing_manifests(self) -> list[ManifestFile]:
            return []  # :meth:`_manifests` lists the parent's

        def _deleted_entries(self) -> list[ManifestEntry]:
            return []

    first = tx.table_metadata.current_snapshot() is None and not removed
    producer = _RowDelta(
        Operation.APPEND if first else Operation.OVERWRITE, tx, tx._table.io, snapshot_properties=properties
    )
    for data_file in (*added, *deletes):
        producer.append_data_file(data_file)  # counted in the snapshot summary
    for data_file in removed:
        if data_file.content in (DataFileContent.DATA, DataFileContent.POSITION_DELETES):
            producer.delete_data_file(data_file)
    producer.commit()
