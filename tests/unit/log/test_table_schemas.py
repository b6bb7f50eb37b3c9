"""log.table_schemas: the one place a topic's key is read from its schema records."""

from __future__ import annotations

import orjson

from log.base import Record, TopicSpec
from log.file.backend import FileLog
from log.table_schemas import latest_schemas, read_schema_records, schema_key
from log.topics import SCHEMAS_TOPIC


def _columns(*flags: bool) -> list[dict]:
    return [{"name": name, "type_oid": 23, "typmod": -1, "key": flag} for name, flag in zip("abc", flags, strict=False)]


def test_explicit_key_wins_over_the_column_flags() -> None:
    assert schema_key({"replica_identity": "f", "key": ["a"], "columns": _columns(True, True, True)}) == ("a",)
    assert schema_key({"replica_identity": "f", "key": [], "columns": _columns(True, True)}) == ()


def test_records_from_before_explicit_keys() -> None:
    # DEFAULT and USING INDEX flagged exactly the record key; FULL flagged every column: unknown.
    assert schema_key({"replica_identity": "d", "columns": _columns(True, False)}) == ("a",)
    assert schema_key({"replica_identity": "i", "columns": _columns(False, True, True)}) == ("b", "c")
    assert schema_key({"replica_identity": "f", "columns": _columns(True, True)}) is None


def test_reads_every_version_and_the_latest(tmp_path) -> None:
    log = FileLog(tmp_path)
    log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
    values = [
        {"topic": "s.p.t", "version": 1, "key": ["a"], "columns": _columns(True)},
        {"topic": "other.p.u", "version": 1, "key": [], "columns": _columns(False)},
        {"topic": "s.p.t", "version": 2, "key": ["a", "b"], "columns": _columns(True, True)},
    ]
    log.append(SCHEMAS_TOPIC, 0, [Record(v["topic"].encode(), orjson.dumps(v)) for v in values])
    assert [v["version"] for v in read_schema_records(log, ["s.p.t"])["s.p.t"]] == [1, 2]
    latest = latest_schemas(log, prefix="s.")
    assert list(latest) == ["s.p.t"]
    assert schema_key(latest["s.p.t"]) == ("a", "b")
    log.close()
