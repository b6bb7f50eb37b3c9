"""The feed writer on the Kafka backend: the columnar plan reaches a broker as the records the file log holds."""

from __future__ import annotations

import orjson
import pyarrow as pa
from harness.topics import partition_records

from core.log_config import KafkaConfig
from derived_feeds.expectations import Check
from derived_feeds.feed_writer import BatchMarker, append_once, plan_batch
from log.base import TopicSpec
from log.file.backend import FileLog
from log.kafka.backend import KafkaLog


def encoded_batch(n: int) -> pa.Table:
    keys = [orjson.dumps({"id": i}).decode() for i in range(n)]
    ops = ["d" if i % 6 == 0 else "u" for i in range(n)]
    values = [f'{{"after":{{"id":{i},"email":"é{i}@x"}},"op":"{op}"}}' for i, op in enumerate(ops)]
    ok = [i % 5 != 0 or op == "d" for i, op in enumerate(ops)]
    dropped = [None if good else f'{{"before":{k},"after":null,"op":"d"}}' for k, good in zip(keys, ok, strict=True)]
    return pa.table({"key": keys, "op": ops, "value": values, "dropped_value": dropped, "__hw_ok0": ok})


def contents(log, topic: str, partitions: int) -> list[list[tuple]]:
    return [[(r.key, r.value, r.headers) for r in partition_records(log, topic, p)] for p in range(partitions)]


def test_kafka_gets_the_records_the_file_log_holds_and_replays_nothing(kafka_broker, unique_name, tmp_path):
    check = Check(0, "expect_column_values_to_not_be_null", "email", "drop")
    marker = BatchMarker("run1", 2)
    plan = plan_batch("f", encoded_batch(60), [check], marker)
    topic = unique_name("feed")
    kafka = KafkaLog(KafkaConfig(bootstrap_servers=kafka_broker.bootstrap_servers))
    try:
        with FileLog(tmp_path / "log") as file_log:
            for log in (kafka, file_log):
                log.create_topic(TopicSpec(topic, partitions=2))
                assert append_once(log, topic, plan.records, marker) == len(plan.records)
            assert contents(kafka, topic, 2) == contents(file_log, topic, 2)
            assert sum(len(p) for p in contents(kafka, topic, 2)) == plan.upserts + 2 * plan.deletes
        assert append_once(kafka, topic, plan.records, marker) == 0, "a replay of batch 2 appends nothing"
    finally:
        kafka.close()
