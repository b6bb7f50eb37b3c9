"""Records written before source kinds and logical types still read the same.

``data/records_before_kinds.json`` holds what the code before source kinds wrote for the recorded
pgoutput stream of ``tests/unit/capture/data/pgoutput_v1.jsonl`` (events and ``_headwater.schemas``
records, in each ``decimal_handling_mode``). Today's code must write byte-identical events, schema
records that differ only by the added ``logical``/``native`` fields, and read the old records with
exactly the types it reads its own with.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from capture.postgres.decoding.pgoutput import PgoutputDecoder
from capture.postgres.events.builder import EventBuilder
from capture.postgres.events.rows import RowConverter, TextRowDecoder
from capture.postgres.streaming.transactions import Transaction, TransactionAssembler
from core.source_config import TypesConfig
from log.envelope import decode_value
from log.sequence import Lsn
from log.table_schemas import column_type
from spark_log.source_schema import row_schema

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capture"))
from pgoutput_recordings import recording, registry

BEFORE = json.loads((Path(__file__).parent / "data" / "records_before_kinds.json").read_text())
MODES = sorted(BEFORE)


def written_now(modes: TypesConfig) -> tuple[list[dict], list[dict]]:
    """Events and schema records today's capture writes for the recorded stream."""
    types = registry()
    decoder, assembler = PgoutputDecoder(1), TransactionAssembler()
    builder = EventBuilder(
        "shop",
        "shopdb",
        lambda rel: TextRowDecoder(RowConverter(rel.columns, modes, types)),
        primary_key=lambda _rel: None,
    )
    events, schemas = [], []
    for row in recording("pgoutput_v1.jsonl"):
        done = assembler.feed(decoder.decode(row.data), Lsn.parse(row.lsn).value)
        if isinstance(done, Transaction):
            records, new_schemas = builder.build(done)
            events += [
                {
                    "topic": r.topic,
                    "key": None if r.key is None else r.key.decode(),
                    "value": None if r.value is None else r.value.decode(),
                    "commit_lsn": r.commit_lsn,
                    "txn_index": r.txn_index,
                }
                for r in records
            ]
            schemas += [{"topic": s.topic, "value": json.loads(s.value)} for s in new_schemas]
    return events, schemas


@pytest.mark.parametrize("mode", MODES)
def test_events_are_written_byte_for_byte_as_before(mode: str) -> None:
    events, _ = written_now(TypesConfig(decimal_handling_mode=mode))
    kept = [e for e in events if e["value"] is None or len(e["value"]) < 3000][: len(BEFORE[mode]["events"])]
    assert kept == BEFORE[mode]["events"]


@pytest.mark.parametrize("mode", MODES)
def test_old_events_decode_and_keep_their_order(mode: str) -> None:
    for event in BEFORE[mode]["events"]:
        if event["value"] is None or event["topic"].endswith(".quarantine"):
            continue
        decoded = decode_value(event["value"].encode())
        assert (decoded.sequence.commit_lsn, decoded.sequence.txn_index) == (event["commit_lsn"], event["txn_index"])
    order = [(e["commit_lsn"], e["txn_index"]) for e in BEFORE[mode]["events"] if e["topic"] == "shop.public.all_types"]
    assert order == sorted(order)


@pytest.mark.parametrize("mode", MODES)
def test_old_schema_records_read_with_the_types_new_ones_record(mode: str) -> None:
    modes = TypesConfig(decimal_handling_mode=mode)
    _, schemas = written_now(modes)
    before = BEFORE[mode]["schemas"]
    assert [s["topic"] for s in schemas] == [s["topic"] for s in before]
    for old, new in zip(before, schemas, strict=True):
        new_columns = new["value"]["columns"]
        # The same record, plus each column's logical type and native name.
        assert [{k: v for k, v in c.items() if k not in ("logical", "native")} for c in new_columns] == old["value"][
            "columns"
        ]
        assert all("logical" in c and "native" in c for c in new_columns)
        for old_column, new_column in zip(old["value"]["columns"], new_columns, strict=True):
            assert column_type(old_column, modes) == column_type(new_column, modes), new_column["name"]
        assert row_schema(old["topic"], [old["value"]], modes) == row_schema(new["topic"], [new["value"]], modes)


def test_the_native_names_of_recorded_columns() -> None:
    _, schemas = written_now(TypesConfig())
    columns = {c["name"]: c for s in schemas if s["topic"] == "shop.public.all_types" for c in s["value"]["columns"]}
    assert columns["c_num_10_2"]["native"] == "numeric(10,2)"
    assert columns["c_num_10_2"]["logical"] == {
        "type": "string",
        "name": "headwater.data.DecimalString",
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
    }
    assert columns["c_varchar"]["native"] == "character varying(20)"
    assert columns["c_ts3"]["logical"] == {"type": "int64", "name": "io.debezium.time.Timestamp"}
    assert columns["c_ts3"]["native"] == "timestamp(3) without time zone"
