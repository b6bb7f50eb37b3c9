"""The ``headwater_log`` reader's executor side without Spark: a file log on disk, ranges read in-process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def _write_log(tmp_path) -> tuple[Path, int]:
    """A file log with one table's topic: keys 0..2, each created then updated; the config's path and the end."""
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
    return config_path, end


def test_latest_per_key_reads_twice_in_one_worker(tmp_path):
    """A reused reader reads ``latestPerKey`` ranges again with the same rows (its schema stays as declared)."""
    config_path, end = _write_log(tmp_path)
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


#: A reader of the log ``_write_log`` wrote, and its one range (``sys.argv``: the config, the topic, the end).
_READER = (
    "from spark_log.data_source import HeadwaterLogDataSource, LogRangePartition\n"
    "from spark_log.offsets import OffsetRange\n"
    "source = HeadwaterLogDataSource({'config': sys.argv[1], 'topic': sys.argv[2]})\n"
    "reader = source.streamReader(source.schema())\n"
    "partition = LogRangePartition(OffsetRange(sys.argv[2], 0, 0, int(sys.argv[3])))\n"
)


def _run_reading(code: str, config_path: Path, end: int) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter, given the log's config, topic and end as arguments."""
    return subprocess.run(
        [sys.executable, "-c", code, str(config_path), TOPIC, str(end)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_a_daemon_worker_freezes_again_after_its_first_read_and_only_then(tmp_path):
    """What pyspark imports after unpickling the reader (pandas) leaves later collections too, from the first read on.

    A fresh interpreter as a forked worker; ``import pandas`` stands for pyspark's own imports then.
    """
    config_path, end = _write_log(tmp_path)
    code = (
        "import gc, importlib.util, sys, pyspark.worker\n"
        "sys.modules['__main__'].__spec__ = importlib.util.find_spec('pyspark.daemon')\n"
        "from spark_log.data_source import HeadwaterLogDataSource, LogRangePartition\n"
        "from spark_log.offsets import OffsetRange\n"
        "import pandas\n" + _READER + "gc.collect()\n"
        "before = len(gc.get_objects())\n"
        "rows = [sum(b.num_rows for b in reader.read(partition)) for _ in range(1)]\n"
        "after_first, frozen = len(gc.get_objects()), gc.get_freeze_count()\n"
        "rows += [sum(b.num_rows for b in reader.read(partition)) for _ in range(3)]\n"
        "print(before, after_first, frozen, gc.get_freeze_count(), *rows)\n"
    )
    result = _run_reading(code, config_path, end)
    before, after_first, frozen, frozen_later, *rows = map(int, result.stdout.split())
    assert rows == [6, 6, 6, 6], result.stdout
    assert before > 20_000, result.stdout  # pandas' objects, imported after the source froze its own
    assert after_first < 5_000, result.stdout  # the first read froze them
    assert frozen_later == frozen, result.stdout  # once: later reads freeze nothing more


def test_elsewhere_importing_the_source_or_reading_freezes_nothing_and_the_process_exits_quietly(tmp_path):
    """A CLI process collects everything at exit: DuckDB's bindings report leaked objects if some stayed frozen."""
    config_path, end = _write_log(tmp_path)
    code = (
        "import gc, sys, duckdb\n"
        "duckdb.connect().execute('SELECT 1').fetchall()\n"
        "from spark_log.data_source import HeadwaterLogDataSource, LogRangePartition\n"
        "from spark_log.offsets import OffsetRange\n"
        "imported = gc.get_freeze_count()\n" + _READER + "rows = sum(b.num_rows for b in reader.read(partition))\n"
        "print(imported, gc.get_freeze_count(), rows)\n"
    )
    result = _run_reading(code, config_path, end)
    assert result.stdout.split() == ["0", "0", "6"], result.stdout
    assert result.stderr == "", result.stderr


def test_planning_imports_no_batch_building_and_the_reader_builds_where_it_reads(tmp_path):
    """A process that only plans (Spark's source runner, its planner workers) never imports the batch building.

    The reader it pickles makes its batch builder in the process that unpickles it and reads.
    """
    config_path, end = _write_log(tmp_path)
    heavy = ("spark_log.source_batches", "spark_log.latest_per_key", "spark_log.value_decoder", "pyarrow.compute")
    code = (
        "import pickle, sys\n"
        + _READER
        + "shipped = pickle.dumps(reader)\n"
        + "start = reader.initialOffset()\n"
        + "reader.partitions(start, reader.latestOffset(start, reader.getDefaultReadLimit()))\n"
        + f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
        + "rows = sum(batch.num_rows for batch in pickle.loads(shipped).read(partition))\n"
        + f"print(sorted(m for m in {heavy!r} if m in sys.modules), rows)\n"
    )
    planned, read = _run_reading(code, config_path, end).stdout.splitlines()[-2:]

    assert planned == "[]"
    # latest_per_key stays unimported: this read is not latestPerKey.
    assert read == f"{['pyarrow.compute', 'spark_log.source_batches', 'spark_log.value_decoder']} {end}"
