"""An Iceberg table's checkpoint: one snapshot that lists the current files in one manifest per content.

A snapshot's manifest list names every manifest a reader opens to plan a scan. Each
micro-batch adds one or two (its new data files, its position deletes), and pyiceberg 0.12
keeps a manifest whose entries a later snapshot all removed (its copy-on-write overwrite
carries it forward with no live entry): measured, a table after 100 one-key copy-on-write
batches had 101 manifests for 1 data file and planning took 4x as long as after 20. The list
grows like a Delta log without checkpoints; :func:`rewrite_manifests` is Iceberg's
rewrite-manifests action and plays the checkpoint's part: the live entries of every manifest,
kept as they are (``EXISTING``, their snapshot and sequence numbers unchanged, so position
deletes apply exactly as before), in one manifest per (content, partition spec); manifests
with no live entry are dropped. No row, file or table property changes.

:func:`extra_manifests` is what the policy counts against ``checkpoint_interval``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from warehouse_loader.iceberg.row_delta import manifest_writer

if TYPE_CHECKING:
    from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestFile
    from pyiceberg.table import Table, Transaction


def extra_manifests(table: Table) -> int:
    """Manifests of the current snapshot beyond one per (content, spec) with live files: what a rewrite removes."""
    current = table.current_snapshot()
    if current is None:
        return 0
    manifests = current.manifests(table.io)
    live = {(m.content, m.partition_spec_id) for m in manifests if m.has_added_files() or m.has_existing_files()}
    return len(manifests) - len(live)


def rewrite_manifests(tx: Transaction, properties: dict[str, str]) -> None:
    """Stage in ``tx`` one snapshot listing the parent's live files in one manifest per (content, spec)."""
    from pyiceberg.manifest import ManifestEntry, ManifestEntryStatus
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _SnapshotProducer

    class _RewriteManifests(_SnapshotProducer["_RewriteManifests"]):
        def _existing_manifests(self) -> list[ManifestFile]:
            parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id or -1)
            groups: dict[tuple[ManifestContent, int], list[ManifestEntry]] = defaultdict(list)
            for manifest in parent.manifests(self._io) if parent is not None else []:
                entries = manifest.fetch_manifest_entry(self._io, discard_deleted=True)
                groups[(manifest.content, manifest.partition_spec_id)].extend(entries)
            written = []
            for (content, spec_id), entries in groups.items():
                if not entries:
                    continue
                with manifest_writer(self, content, spec_id) as writer:
                    for entry in entries:
                        writer.add_entry(
                            ManifestEntry.from_args(
                                status=ManifestEntryStatus.EXISTING,
                                snapshot_id=entry.snapshot_id,
                                sequence_number=entry.sequence_number,
                                file_sequence_number=entry.file_sequence_number,
                                data_file=entry.data_file,
                            )
                        )
                written.append(writer.to_manifest_file())
            return written

        def _deleted_entries(self) -> list[ManifestEntry]:
            return []

    # pyiceberg writes no ``replace`` snapshot (its summaries refuse the operation): an overwrite
    # that adds and removes nothing, as compaction's.
    _RewriteManifests(Operation.OVERWRITE, tx, tx._table.io, snapshot_properties=properties).commit()
