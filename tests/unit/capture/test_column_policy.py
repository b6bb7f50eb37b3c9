"""Column rules: left-out and masked values never leave the event builder (events, quarantine, schemas, errors)."""

from __future__ import annotations

import hashlib

import orjson
import pytest

import capture.postgres.decoding.pgoutput  # noqa: F401  (registers the change types with the native encoder, as the agent does)
from capture.column_policy import ColumnPolicy, column_mask
from capture.errors import ColumnSettingError, KeyColumnExcludedError
from capture.postgres.decoding.pgoutput_messages import Insert, Relation, RelationColumn, ReplicaIdentity, Update
from capture.postgres.events.builder import EventBuilder
from capture.postgres.events.relations import column_shapes
from capture.postgres.events.rows import RowConverter, TextRowDecoder
from capture.postgres.streaming.transactions import Transaction
from capture.tuples import UNCHANGED_TOAST
from core.source_config import ColumnsConfig, MaskConfig, TypesConfig
from log.pg_types import Oid
from log.sequence import Lsn
from log.topics import ERROR_HEADER

SECRET_SSN = "123-45-6789"
SECRET_EMAIL = "jane.doe@example.org"
SALT = "pepper-7f3a"


def relation() -> Relation:
    return Relation(
        7,
        "public",
        "people",
        ReplicaIdentity.DEFAULT,
        (
            RelationColumn(True, "id", Oid.INT4, -1),
            RelationColumn(False, "ssn", Oid.TEXT, -1),
            RelationColumn(False, "email", Oid.VARCHAR, 20 + 4),
            RelationColumn(False, "balance", Oid.NUMERIC, -1),
        ),
    )


def typemap_decoders(modes: TypesConfig):
    def decoder_for(rel: Relation) -> TextRowDecoder:
        return TextRowDecoder(RowConverter(rel.columns, modes))

    return decoder_for


def txn(changes: list, xid: int = 42) -> Transaction:
    return Transaction(
        xid, Lsn(0x100), Lsn(0x108), 1_700_000_000_123_456, changes, [1000 + i for i in range(len(changes))]
    )


def everything(records, schemas) -> bytes:
    """Every byte the builder produced: keys, values, headers, schema records."""
    parts = [b"%r" % (r.key,) + (r.value or b"") + b"".join(v for _, v in r.headers) for r in records]
    return b"\n".join(parts + [s.value for s in schemas])


def test_an_excluded_column_is_not_in_the_quarantine_record() -> None:
    """The leak of issue 21: a quarantined row wrote every column raw, the excluded ones too."""
    builder = EventBuilder(
        "src",
        "db",
        typemap_decoders(TypesConfig(decimal_handling_mode="precise")),
        excluded_columns=["public.people.ssn"],
    )
    rel = relation()
    # numeric NaN cannot be written in precise mode: the change goes to quarantine.
    records, schemas = builder.build(txn([rel, Insert(7, ("1", SECRET_SSN, "x@y.z", "NaN"))]))
    (record,) = records
    assert record.topic == "src.public.people.quarantine"
    assert dict(record.headers)[ERROR_HEADER]
    assert SECRET_SSN.encode() not in everything(records, schemas)
    assert orjson.loads(record.value)["after_raw"] == {"id": "1", "email": "x@y.z", "balance": "NaN"}


@pytest.mark.parametrize("use_native", [True, False])
def test_masked_and_left_out_values_appear_nowhere(use_native: bool) -> None:
    columns = ColumnsConfig(
        exclude=("public.people.ssn",),
        mask={"public.people.email": MaskConfig(hash="sha256", salt=SALT)},
    )
    builder = EventBuilder(
        "src",
        "db",
        typemap_decoders(TypesConfig(decimal_handling_mode="precise")),
        columns=columns,
        use_native=use_native,
    )
    rel = relation()
    changes = [
        rel,
        Insert(7, ("1", SECRET_SSN, SECRET_EMAIL, "1.5")),
        Insert(7, ("2", SECRET_SSN, SECRET_EMAIL, "NaN")),  # quarantined
        Update(7, None, ("1", SECRET_SSN, UNCHANGED_TOAST, "2.5")),  # TOAST filled from the masked image
        Insert(7, ("3", "not-a-number", SECRET_EMAIL, "oops")),  # quarantined: the error quotes 'oops' only
    ]
    records, schemas = builder.build(txn(changes))
    produced = everything(records, schemas)
    for secret in (SECRET_SSN, SECRET_EMAIL, SALT, "not-a-number"):
        assert secret.encode() not in produced
    hashed = hashlib.sha256((SALT + SECRET_EMAIL).encode()).hexdigest()[:20]  # cut to varchar(20)
    values = [orjson.loads(r.value) for r in records if r.value is not None]
    assert values[0]["after"] == {"id": 1, "email": hashed, "balance": 1.5} or values[0]["after"]["email"] == hashed
    assert values[1]["after_raw"] == {"id": "2", "email": hashed, "balance": "NaN"}
    assert values[2]["after"]["email"] == hashed
    schema = orjson.loads(schemas[0].value)
    assert [c["name"] for c in schema["columns"]] == ["id", "email", "balance"]
    assert schema["columns"][1] | {} == {
        "name": "email",
        "logical": {"type": "string"},  # masked values are strings whatever the column's type
        "native": "character varying(20)",
        "type_oid": 25,
        "typmod": -1,
        "key": False,
        "masked": "hash",
    }


def test_an_include_list_keeps_only_its_columns_of_its_table() -> None:
    builder = EventBuilder(
        "src",
        "db",
        typemap_decoders(TypesConfig()),
        columns=ColumnsConfig(include=("public.people.id", "public.people.balance")),
    )
    records, schemas = builder.build(txn([relation(), Insert(7, ("1", SECRET_SSN, SECRET_EMAIL, "1.5"))]))
    assert orjson.loads(records[0].value)["after"] == {"id": 1, "balance": "1.5"}
    assert SECRET_SSN.encode() not in everything(records, schemas)


def test_key_columns_must_be_captured_and_not_merged_by_a_mask() -> None:
    left_out = EventBuilder(
        "s", "db", typemap_decoders(TypesConfig()), columns=ColumnsConfig(include=("public.people.ssn",))
    )
    with pytest.raises(KeyColumnExcludedError, match=r"sources\.s\.columns\.include: public\.people\.id is part of"):
        left_out.relation(relation())
    replaced = EventBuilder(
        "s",
        "db",
        typemap_decoders(TypesConfig()),
        columns=ColumnsConfig(mask={"public.people.id": MaskConfig(replace="*")}),
    )
    with pytest.raises(ColumnSettingError, match=r"sources\.s\.columns\.mask: public\.people\.id is part of the key"):
        replaced.relation(relation())
    hashed = EventBuilder(
        "s",
        "db",
        typemap_decoders(TypesConfig()),
        columns=ColumnsConfig(mask={"public.people.id": MaskConfig(hash="sha256", salt="k")}),
    )
    records, _ = hashed.build(txn([relation(), Insert(7, ("1", "a", "b", "1"))]))
    assert records[0].key == orjson.dumps({"id": hashlib.sha256(b"k1").hexdigest()})


def test_the_hash_masks_reproduce_debezium() -> None:
    """Values Debezium 3.6.3 wrote for salt 'salt' (and its MaskStringsTest vectors)."""
    v1 = MaskConfig(hash="sha256", salt="salt", version=1)
    v2 = MaskConfig(hash="sha256", salt="salt", version=2)
    assert column_mask(v1).mask("hello") == "af5843a0f0e728ab0332c8888b6e1190bfb79e584f0d40538de8f10df6ef29c6"
    assert column_mask(v2).mask("hello") == "cd31b3b98ece60cb739c0bf770b2de892ae0ad133f645513c3d83f08757a843a"
    assert column_mask(MaskConfig(hash="md5", salt="salt", version=1)).mask("hello") == (
        "46f48a7a5ea32efba87cbff49d46d35a"
    )
    assert column_mask(MaskConfig(hash="md5", salt="salt")).mask("world") == "172c8e95398cc72ab5358ead6981e7e5"
    # Cut to the column's length: varchar(10) and char(5) (whose text keeps its padding).
    varchar, bpchar = column_shapes(
        Relation(
            1,
            "public",
            "t",
            ReplicaIdentity.DEFAULT,
            (RelationColumn(False, "v", Oid.VARCHAR, 10 + 4), RelationColumn(False, "c", Oid.BPCHAR, 5 + 4)),
        )
    )
    assert (varchar.char_length, bpchar.char_length) == (10, 5)
    assert column_mask(v1, varchar.char_length).mask("hello") == "af5843a0f0"
    assert column_mask(v1, bpchar.char_length).mask("ab   ") == "33b44"
    assert column_mask(MaskConfig(truncate=3)).mask("😀😀😀😀") == "😀😀😀"


def test_named_columns_per_table() -> None:
    policy = ColumnPolicy(
        ColumnsConfig(include=("a.t.x",), mask={"a.t.x": MaskConfig(replace="*"), "b.u.y.z": MaskConfig(truncate=1)})
    )
    assert policy.named_columns() == {"a.t": [("include", "x"), ("mask", "x")], "b.u": [("mask", "y.z")]}


def test_a_toast_value_filled_from_an_image_written_before_the_mask_is_masked() -> None:
    """Masking configured on a table the log already holds: an unchanged TOAST value taken from an
    image written before is masked now (a string), or the change is quarantined (another type)."""
    raw_image = {"id": 1, "ssn": SECRET_SSN, "email": SECRET_EMAIL, "balance": "1.5"}
    columns = ColumnsConfig(
        mask={
            "public.people.email": MaskConfig(hash="sha256", salt=SALT),
            "public.people.ssn": MaskConfig(replace="***"),
            "public.people.balance": MaskConfig(truncate=1),
        }
    )
    builder = EventBuilder(
        "src",
        "db",
        typemap_decoders(TypesConfig()),
        columns=columns,
        previous_image=lambda _topic, _key, _before: raw_image,
    )
    records, schemas = builder.build(
        txn([relation(), Update(7, None, ("1", UNCHANGED_TOAST, UNCHANGED_TOAST, UNCHANGED_TOAST))])
    )
    hashed = hashlib.sha256((SALT + SECRET_EMAIL).encode()).hexdigest()[:20]
    assert orjson.loads(records[0].value)["after"] == {"id": 1, "ssn": "***", "email": hashed, "balance": "1"}
    assert SECRET_EMAIL.encode() not in everything(records, schemas)
    # Filled again from the (now masked) image: unchanged.
    raw_image.update(orjson.loads(records[0].value)["after"])
    again, _ = builder.build(txn([Update(7, None, ("1", UNCHANGED_TOAST, UNCHANGED_TOAST, "2"))], xid=43))
    assert orjson.loads(again[0].value)["after"] == {"id": 1, "ssn": "***", "email": hashed, "balance": "2"}
    raw_image["email"] = 987654321  # not a string: cannot be masked as its text was
    builder._images.images.clear()
    quarantined, _ = builder.build(txn([Update(7, None, ("1", "x", UNCHANGED_TOAST, "3"))], xid=44))
    assert quarantined[0].topic.endswith(".quarantine") and b"987654321" not in quarantined[0].value
