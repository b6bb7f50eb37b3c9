"""What a table's new shape means for its existing rows: renames by column number, re-reads, races."""

from __future__ import annotations

from capture.postgres.catalog_state import CatalogColumn, CatalogTable
from capture.postgres.decoding.pgoutput_messages import ReplicaIdentity
from capture.postgres.events.schema_transitions import REWRITTEN, schema_change

INT, TEXT, BIGINT = 23, 25, 20


def table(columns: list[tuple[int, str, int, bool]], storage: str = "100") -> CatalogTable:
    return CatalogTable(
        oid=1,
        namespace="s",
        name="t",
        replica_identity=ReplicaIdentity.DEFAULT,
        storage=storage,
        columns=tuple(CatalogColumn(n, name, oid, -1, filled, n == 1) for n, name, oid, filled in columns),
        primary_key=("id",),
    )


def record(columns: list[tuple[int, str, int]], storage: str | None = "100") -> dict:
    body: dict = {"columns": [{"name": name, "type_oid": oid, "typmod": -1, "attnum": n} for n, name, oid in columns]}
    if storage is not None:
        body["storage"] = storage
    return body


BEFORE = record([(1, "id", INT), (2, "note", TEXT)])


def test_a_rename_is_found_by_column_number_and_reads_nothing_again() -> None:
    now = table([(1, "id", INT, False), (2, "remark", TEXT, False)])
    change = schema_change(BEFORE, now, now.relation())
    assert change.renamed == {"remark": "note"}
    assert change.reread is None
    assert change.attnums == {"id": 1, "remark": 2}


def test_a_dropped_and_re_added_column_is_not_a_rename_and_is_read_again() -> None:
    now = table([(1, "id", INT, False), (3, "note", TEXT, False)])
    change = schema_change(BEFORE, now, now.relation(), names_seen={"note"})
    assert change.renamed == {}
    assert change.reread is not None and "earlier column" in change.reread


def test_a_default_filled_in_place_is_read_again_a_nullable_column_is_not() -> None:
    filled = table([(1, "id", INT, False), (2, "note", TEXT, False), (3, "tag", TEXT, True)])
    assert "default" in (schema_change(BEFORE, filled, filled.relation()).reread or "")
    plain = table([(1, "id", INT, False), (2, "note", TEXT, False), (3, "tag", TEXT, False)])
    assert schema_change(BEFORE, plain, plain.relation()).reread is None


def test_a_rewrite_is_read_again_a_type_change_without_one_is_not() -> None:
    rewritten = table([(1, "id", INT, False), (2, "note", BIGINT, False)], storage="200")
    assert "changed type" in (schema_change(BEFORE, rewritten, rewritten.relation()).reread or "")
    in_place = table([(1, "id", INT, False), (2, "note", BIGINT, False)])
    assert schema_change(BEFORE, in_place, in_place.relation()).reread is None
    same_shape = table([(1, "id", INT, False), (2, "note", TEXT, False)], storage="300")
    assert "rewritten" in (schema_change(BEFORE, same_shape, same_shape.relation()).reread or "")


def test_a_catalog_that_moved_on_claims_no_rename_and_reads_the_rows_again() -> None:
    at_relation = table([(1, "id", INT, False), (2, "remark", TEXT, False)])
    later = table([(1, "id", INT, False), (2, "comment", TEXT, False)])
    change = schema_change(BEFORE, later, at_relation.relation())
    assert change.renamed == {}
    assert change.attnums == {}
    assert change.reread is not None


def test_a_detached_partition_is_reported() -> None:
    parts = record([(1, "id", INT), (2, "note", TEXT)], storage="10:110,11:111")
    now = table([(1, "id", INT, False), (2, "note", TEXT, False)], storage="10:110")
    change = schema_change(parts, now, now.relation())
    assert change.partitions_dropped
    assert change.reread is not None
    attached = table([(1, "id", INT, False), (2, "note", TEXT, False)], storage="10:110,11:111,12:112")
    assert not schema_change(parts, attached, attached.relation()).partitions_dropped


def test_a_partitioned_table_rewritten_in_place_is_a_rewrite_a_changed_partition_set_is_not() -> None:
    """Same leaves, new storage (TRUNCATE, VACUUM FULL): a rewrite, which a TRUNCATE in the stream explains."""
    parts = record([(1, "id", INT), (2, "note", TEXT)], storage="10:110,11:111")
    truncated = table([(1, "id", INT, False), (2, "note", TEXT, False)], storage="10:210,11:211")
    assert schema_change(parts, truncated, truncated.relation()).reread == REWRITTEN
    attached = table([(1, "id", INT, False), (2, "note", TEXT, False)], storage="10:110,11:111,12:112")
    reread = schema_change(parts, attached, attached.relation()).reread
    assert reread == "the table was rewritten or its partitions changed"


# Capture stopped across two DDLs: the stream replays the first one's Relation while the catalog
# already holds the second one's state.

THREE = record([(1, "id", INT), (2, "note", TEXT), (3, "name", TEXT)])
BASE3 = [(1, "id", INT, False), (2, "note", TEXT, False), (3, "name", TEXT, False)]


def test_a_rename_replayed_after_a_later_rename_is_placed_by_column_number() -> None:
    at_relation = table([(1, "id", INT, False), (2, "remark", TEXT, False), (3, "name", TEXT, False)])
    later = table([(1, "id", INT, False), (2, "remark", TEXT, False), (3, "label", TEXT, False)])
    change = schema_change(THREE, later, at_relation.relation())
    assert change.renamed == {"remark": "note"}
    assert change.attnums == {"id": 1, "remark": 2, "name": 3}
    assert change.reread is None and change.storage is None


def test_a_drop_replayed_after_a_later_drop_reads_nothing_again() -> None:
    at_relation = table([(1, "id", INT, False), (3, "name", TEXT, False)])
    later = table([(1, "id", INT, False)])
    change = schema_change(THREE, later, at_relation.relation())
    assert change.attnums == {"id": 1, "name": 3}
    assert change.renamed == {} and change.reread is None


def test_a_default_replayed_after_a_later_default_is_read_again_by_its_own_fill() -> None:
    at_relation = table([*BASE3, (4, "t3", TEXT, False)])
    later = table([*BASE3, (4, "t3", TEXT, True), (5, "t4", INT, True)])
    change = schema_change(THREE, later, at_relation.relation())
    assert change.attnums["t3"] == 4
    assert change.reread is not None and "'t3' was added with a default" in change.reread


def test_new_storage_seen_past_the_relation_reads_again_and_keeps_the_previous_storage() -> None:
    """A volatile default added twice while capture was down: the second version must still find the rewrite."""
    at_relation = table([*BASE3, (4, "t3", TEXT, False)])
    later = table([*BASE3, (4, "t3", TEXT, False), (5, "t4", INT, False)], storage="300")
    change = schema_change(THREE, later, at_relation.relation())
    assert change.reread is not None and "storage changed" in change.reread
    assert change.storage == "100"


def test_a_name_that_cannot_be_placed_by_number_claims_no_rename() -> None:
    # Names swapped (the name 'note' has number 2 before, 3 in the catalog).
    swapped = table([(1, "id", INT, False), (2, "name", TEXT, False), (3, "note", TEXT, False)])
    at_relation = table(
        [(1, "id", INT, False), (2, "name", TEXT, False), (3, "note", TEXT, False), (4, "x", INT, False)]
    )
    assert schema_change(THREE, swapped, at_relation.relation()).attnums == {}
    # 'note' dropped, 'name' renamed to 'note', then renamed to 'z': the Relation's 'note' is column 3.
    at_relation = table([(1, "id", INT, False), (3, "note", TEXT, False)])
    later = table([(1, "id", INT, False), (3, "z", TEXT, False)])
    change = schema_change(THREE, later, at_relation.relation())
    assert change.attnums == {} and change.renamed == {}
    assert change.reread is not None
