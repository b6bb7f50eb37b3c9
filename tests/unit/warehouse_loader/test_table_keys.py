"""A warehouse table's key: read from the schema record, checked against the key its rows were merged on."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest
import yaml
from deltalake import write_deltalake

from core.config import load_config
from log.base import Record, TopicSpec, append_keyed
from log.factory import open_log
from log.topics import SCHEMAS_TOPIC
from warehouse_loader.changes import OP, SEQ
from warehouse_loader.delta.writer import loaded_key, write_scd1
from warehouse_loader.load_job import TableKeyError, table_key_problem, table_keys, table_path

TOPIC = "src.public.people"


def project(tmp_path):
    path = tmp_path / "headwater.yaml"
    path.write_text(yaml.safe_dump({"project": "keys", "warehouse": {"tables": {"people": {"from": TOPIC}}}}))
    config = load_config(path)
    log = open_log(config)
    log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1), exist_ok=True)
    return config, log


def record_schema(log, version: int, **fields) -> None:
    columns = [{"name": n, "type_oid": 23, "typmod": -1, "key": True} for n in ("id", "age")]
    value = {"topic": TOPIC, "schema": "public", "table": "people", "columns": columns, "version": version, **fields}
    append_keyed(log, SCHEMAS_TOPIC, [Record(TOPIC.encode(), orjson.dumps(value))])


def changes(*rows: tuple[int, int, str, str]) -> pa.Table:
    return pa.table(
        {"id": [r[0] for r in rows], "age": [r[1] for r in rows], OP: [r[2] for r in rows], SEQ: [r[3] for r in rows]}
    )


def test_full_identity_key_is_the_recorded_key_not_every_flagged_column(tmp_path):
    config, log = project(tmp_path)
    record_schema(log, 1, replica_identity="f", key=["id"])
    assert table_keys(config, log, "people") == ("id",)


def test_a_schema_from_before_recorded_keys_says_to_run_capture(tmp_path):
    config, log = project(tmp_path)
    record_schema(log, 1, replica_identity="f")  # every column flagged: the key is not known
    with pytest.raises(TableKeyError, match="capture src --until-caught-up"):
        table_keys(config, log, "people")


def test_a_table_merged_on_every_column_is_refused_once_the_key_is_known(tmp_path):
    config, log = project(tmp_path)
    record_schema(log, 1, replica_identity="f")
    # Loaded by the old code: merged on (id, age), no key in its commits.
    write_deltalake(str(table_path(config, "people")), changes((1, 30, "r", "a"), (1, 31, "u", "b")))
    record_schema(log, 2, replica_identity="f", key=["id"])  # what capture records now
    with pytest.raises(TableKeyError, match="headwater reprocess people"):
        table_keys(config, log, "people")
    assert "reprocess people" in (table_key_problem(config, log, "people") or "")


def test_commits_record_the_key_and_a_changed_key_is_refused(tmp_path):
    config, log = project(tmp_path)
    record_schema(log, 1, replica_identity="d", key=["id"])
    path = table_path(config, "people")
    write_scd1(path, changes((1, 30, "c", "a")), table="people", batch_id=0, keys=["id"])
    assert loaded_key(path) == ("id",)
    assert table_keys(config, log, "people") == ("id",)
    record_schema(log, 2, replica_identity="d", key=["id", "age"])
    with pytest.raises(TableKeyError, match=r"merged on key \(id\) but its input is now keyed by \(id, age\)"):
        table_keys(config, log, "people")


def test_a_keyless_topic_names_the_config_key_that_fixes_it(tmp_path):
    config, log = project(tmp_path)
    record_schema(log, 1, replica_identity="f", key=[])
    with pytest.raises(TableKeyError, match=r"sources\.src\.keys: \{public\.people: \[column, \.\.\.\]\}"):
        table_keys(config, log, "people")
