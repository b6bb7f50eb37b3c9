"""The background cleaner beside a writer and readers, with real processes (``headwater log clean --follow``).

File backend: the cleaner compacts while a writer appends changes and deletes of 40 keys
and a reader follows the topic; every record the reader never saw must be one compaction
may remove (superseded by a later record of its key, or a tombstone), every record still
held is the one written at its offset, and a reader starting afterwards finds each key's
latest state. Kafka: the broker compacts; the cleaner aligns topic configs with
``log.topics`` (tansu 0.6 stores them but does not compact, so only the configs are checked).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from harness.topics import partition_records

from core.config import load_config
from core.log_config import KafkaConfig, TopicCleaningConfig
from log.base import Log, StoredRecord, TopicPartition, TopicSpec
from log.cleaner import Cleaner
from log.factory import consumer_of, open_log
from log.file.backend import FileLog
from log.kafka.backend import KafkaLog
from log.partitioner import partition_for
from log.topic_policy import TopicPolicies

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("group_processes.py")
REPO = Path(__file__).resolve().parents[3]
TOPIC = "upd-t"
LAG_MS, DELETE_RETENTION_MS = 1500, 1000
CONFIG = f"""project: p
log:
  cleaner_interval_s: 0.2
  topics:
    "upd-*": {{min_compaction_lag_ms: {LAG_MS}, delete_retention_ms: {DELETE_RETENTION_MS}, segment_bytes: 2048}}
"""


def _follow(log: Log, stop: threading.Event, seen: list[StoredRecord]) -> None:
    consumer = consumer_of(log, None, owns_log=True)
    consumer.assign([TopicPartition(TOPIC, p) for p in range(2)])
    while not stop.is_set():
        seen.extend(consumer.poll(timeout_s=0.1))
    seen.extend(consumer.poll(timeout_s=0.5))
    consumer.close()


def written_records(total: int, keys: int) -> dict[tuple[int, int], tuple[bytes, bytes | None]]:
    """What ``group_processes.py updates`` appends, by (partition, offset): the writer is deterministic."""
    written: dict[tuple[int, int], tuple[bytes, bytes | None]] = {}
    ends = [0, 0]
    for n in range(total):
        key = b"k%d" % (n % keys)
        partition = partition_for(key, 2)
        written[(partition, ends[partition])] = (key, None if (n // keys) % 7 == 6 else b"%d" % n)
        ends[partition] += 1
    return written


def test_the_cleaner_beside_a_writer_and_readers_removes_only_what_compaction_may(tmp_path: Path) -> None:
    (tmp_path / "headwater.yaml").write_text(CONFIG)
    config = load_config(tmp_path / "headwater.yaml")
    log = open_log(config)
    assert isinstance(log, FileLog)
    log.create_topic(TopicSpec(TOPIC, partitions=2))  # created as capture does: 7 days of lag, by its spec
    assert log.describe_topic(TOPIC).min_compaction_lag_ms == LAG_MS  # log.topics applies
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cleaner = subprocess.Popen(
        [sys.executable, "-m", "headwater", "log", "clean", "--follow"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    stop, seen = threading.Event(), []
    reader = threading.Thread(target=_follow, args=(open_log(config), stop, seen))
    reader.start()
    total, keys = 3000, 40
    spec = json.dumps({"config": str(tmp_path / "headwater.yaml")})
    writer = subprocess.run(
        [sys.executable, str(SCRIPT), "updates", spec, TOPIC, str(total), str(keys), "7", "0.004"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert writer.returncode == 0, writer.stderr
    time.sleep((LAG_MS + DELETE_RETENTION_MS) / 1000 + 1.5)  # superseded records and expired tombstones go
    stop.set()
    reader.join()
    cleaner.terminate()
    out, _ = cleaner.communicate(timeout=60)
    assert cleaner.returncode == 0, out
    assert "->" in out, "the cleaner reported no pass"

    written = written_records(total, keys)
    ends = {p: log.end_offset(TOPIC, p) for p in range(2)}
    assert ends == {p: sum(1 for q, _ in written if q == p) for p in range(2)}
    held = {(r.partition, r.offset): (r.key, r.value) for p in range(2) for r in partition_records(log, TOPIC, p)}
    assert len(held) < total, "nothing was compacted"
    assert all(written[position] == record for position, record in held.items()), "a record changed"
    live = {(r.partition, r.offset): (r.key, r.value) for r in seen}
    assert all(written[position] == record for position, record in live.items()), "the reader saw a changed record"
    # What the live reader never saw, compaction was allowed to remove: a superseded record or a tombstone.
    last_of_key = {key: position for position, (key, _) in sorted(written.items())}
    for position, (key, value) in sorted(written.items()):
        if position not in live:
            assert value is None or last_of_key[key] != position, f"the reader never saw {position}: {key!r}"
    # A reader starting now finds every key's latest state (a deleted key: a tombstone, or nothing at all).
    fresh = {key: value for _, (key, value) in sorted(held.items())}
    for key, position in last_of_key.items():
        assert fresh.get(key) == written[position][1], f"key {key!r}: a fresh reader finds {fresh.get(key)!r}"
    usage = log.usage(TOPIC)
    assert usage.bytes > 0 and 0.0 <= usage.dirty_ratio <= 1.0
    log.close()


def test_on_kafka_the_cleaner_aligns_topic_configs_with_log_topics(log_kafka_bootstrap: str, topic_name: str) -> None:
    config = KafkaConfig(bootstrap_servers=log_kafka_bootstrap)
    entry = TopicCleaningConfig(cleanup="compact,delete", retention_ms=3_600_000, min_compaction_lag_ms=1000)
    with KafkaLog(config) as plain, KafkaLog(config, policies=TopicPolicies({"t-*": entry})) as configured:
        plain.create_topic(TopicSpec(topic_name, partitions=1))  # created by its own spec, as capture does
        assert plain.describe_topic(topic_name).retention_ms is None
        cleaner = Cleaner(configured)
        [done] = cleaner.run_once([topic_name])
        assert done.configs_changed
        spec = plain.describe_topic(topic_name)
        assert (spec.compacted, spec.retention_ms, spec.min_compaction_lag_ms) == (True, 3_600_000, 1000)
        configs = {k: v.value for k, v in plain.client.topic_configs(topic_name).items()}
        assert configs["cleanup.policy"] == "compact,delete"
        assert cleaner.run_once([topic_name]) == []  # aligned: nothing more to change
