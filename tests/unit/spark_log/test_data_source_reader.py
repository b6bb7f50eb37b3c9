"""The ``headwater_log`` reader's executor side without Spark: a file log on disk, ranges read in-process."""

from __future__ import annotations

import subprocess
import sys

import orjson
import yaml

from capture.postgres.events.source_block import postgres_source
from core.config import load_config
from log.base import Record, TopicSpec, append_keyed
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from log.factory import open_log
from log.topics import SCHEMAS_TOPIC
from spark_log.data_source import HeadwaterLogDataSource, LogRangePartition
from spark_log.offsets import OffsetRange
from spark_log.source_schema import FIRST_OP

TOPIC = "shop.public.items"


def test_latest_per_key_reads_twice_in_one_worker(tmp_path):
    """A reused reader reads ``latestPerKey`` ranges again with the same rows (its schema stays as declared)."""
    config_path = tmp_path / "headwater.yaml"
    config_path.write_text(yaml.safe_dump({"project": "p", "home": str(tmp_path / "home"), "log": {"partitions": 1}}))
    log = open_log(load_config(config_path))
    try:
        log.create_topic(TopicSpec(TOPIC, partitions=1))
        log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
        columns = [{"name": "id", "type_oid": 20, "typmod": -1, "key": True}]
        schema = {"topic": TOPIC, "schema": "public", "table": "items", "columns": columns, "version": 1}
        log.append(SCHEMAS_TOPIC, 0, [Record(TOPIC.encode(), orjson.dumps(schema))])
        changes = []
        for step in range(6):  # keys 0..2, each created then updated
            source = postgres_source(
                "shop", "shop", "public", "items", step, step, 100 + step, 0, 1_700_000_000_000_000
            )
            op = Op.CREATE if step < 3 else Op.UPDATE
            changes.append(
                Record(encode_key({"id": step % 3}), encode_value(ChangeEvent(op, source, None, {"id": step % 3}, 0)))
            )
        append_keyed(log, TOPIC, changes)
        end = log.end_offset(TOPIC, 0)
    finally:
        log.close()

    source = HeadwaterLogDataSource({"config": str(config_path), "topic": TOPIC, "latestPerKey": "true"})
    reader = source.streamReader(source.schema())
    declared = reader.builder.schema.fieldNames()
    partition = LogRangePartition(OffsetRange(TOPIC, 0, 0, end))
    reads = [[row for batch in reader.read(partition) for row in batch.to_pylist()] for _ in range(2)]

    assert reads[0] == reads[1]
    assert sorted((row["after"]["id"], row["op"], row[FIRST_OP]) for row in reads[0]) == [
        (0, "u", "c"),
        (1, "u", "c"),
        (2, "u", "c"),
    ]
    assert reader.builder.schema.fieldNames() == declared


def test_a_worker_reads_the_config_again_only_when_its_file_changed(tmp_path):
    """Task after task in one worker gets the config read once; a rewritten file is read again."""
    config_path = tmp_path / "headwater.yaml"
    config_path.write_text(yaml.safe_dump({"project": "p", "home": str(tmp_path / "home"), "log": {"partitions": 1}}))
    options = HeadwaterLogDataSource({"config": str(config_path), "topic": TOPIC}).parsed
    first = options.load_config()
    assert options.load_config() is first
    config_path.write_text(yaml.safe_dump({"project": "p", "home": str(tmp_path / "home"), "log": {"partitions": 12}}))
    again = options.load_config()
    assert again is not first and again.log.partitions == 12


def test_in_a_daemon_worker_importing_the_source_leaves_its_imports_out_of_later_collections():
    """pyspark's daemon collects garbage after every task of a reused worker: only what a task allocated is visited.

    A fresh interpreter whose ``__main__`` is ``pyspark.daemon``, as a forked Python worker's is when its
    first task unpickles the reader.
    """
    code = (
        "import gc, importlib.util, sys, pyspark.worker\n"
        "sys.modules['__main__'].__spec__ = importlib.util.find_spec('pyspark.daemon')\n"
        "before = len(gc.get_objects())\n"
        "import spark_log.data_source\n"
        "frozen = gc.get_freeze_count()\n"
        "junk = [[i] for i in range(1000)]\n"
        "print(before, frozen, len(gc.get_objects()))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, frozen, tracked = result.stdout.split()
    assert int(frozen) > int(before) > 10_000, result.stdout  # pyspark's and the source's objects
    assert int(tracked) < 5_000, result.stdout  # a collection now visits the task's objects, not the imports'


def test_elsewhere_importing_the_source_freezes_nothing_and_the_process_exits_quietly():
    """A CLI process collects everything at exit: DuckDB's bindings report leaked objects if some stayed frozen."""
    code = (
        "import gc, duckdb\n"
        "duckdb.connect().execute('SELECT 1').fetchall()\n"
        "import spark_log.data_source\n"
        "print(gc.get_freeze_count())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split() == ["0"], result.stdout
    assert result.stderr == "", result.stderr
