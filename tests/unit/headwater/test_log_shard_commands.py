"""``headwater log split|merge|shards``: the map after each, one-line refusals, Kafka's refusal."""

import subprocess
import sys

import orjson

from log.base import Record, TopicSpec, append_keyed
from log.file.backend import FileLog

TOPIC = "shop.public.t"


def headwater(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "headwater", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def populate(tmp_path):
    (tmp_path / "headwater.yaml").write_text("project: p\n")
    with FileLog(tmp_path / ".headwater" / "log") as log:
        log.create_topic(TopicSpec(TOPIC, partitions=2))
        append_keyed(log, TOPIC, [Record(b'{"id":%d}' % i, b"{}") for i in range(40)])


def test_split_merge_and_shards(tmp_path):
    populate(tmp_path)
    split = headwater("log", "split", TOPIC, "0", "--json", cwd=tmp_path)
    assert split.returncode == 0, split.stderr
    rows = orjson.loads(split.stdout)
    assert [r["state"] for r in rows] == ["sealed", "open", "open", "open"]
    assert rows[0]["children"] == [2, 3] and rows[2]["parents"] == [0]
    assert rows[2]["hash_from"] == rows[0]["hash_from"] and rows[3]["hash_to"] == rows[0]["hash_to"]
    at = rows[3]["hash_from"] + 10
    again = headwater("log", "split", TOPIC, "3", "--at", str(at), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "partition 3 sealed at offset 0; new: 4, 5" in again.stdout
    merged = headwater("log", "merge", TOPIC, "5", "1", "--json", cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    rows = orjson.loads(merged.stdout)
    assert rows[6]["parents"] == [1, 5] and rows[6]["hash_from"] == at
    shown = headwater("log", "shards", TOPIC, cwd=tmp_path)
    assert shown.returncode == 0 and "sealed" in shown.stdout
    topics = orjson.loads(headwater("log", "topics", "--json", cwd=tmp_path).stdout)
    assert topics[0]["partitions"] == 7 and topics[0]["records"] == 40


def test_bad_input_is_one_line_and_changes_nothing(tmp_path):
    populate(tmp_path)
    assert headwater("log", "split", TOPIC, "0", cwd=tmp_path).returncode == 0
    before = (tmp_path / ".headwater" / "log" / TOPIC / "shards.json").read_bytes()
    cases = [
        (("log", "split", TOPIC, "0"), "is sealed"),
        (("log", "split", TOPIC, "9"), "not 9"),
        (("log", "split", TOPIC, "1", "--at", "1"), "outside partition"),
        (("log", "merge", TOPIC, "2", "1"), "not adjacent"),
        (("log", "merge", TOPIC, "0", "1"), "is sealed"),
        (("log", "merge", TOPIC, "1", "1"), "with itself"),
        (("log", "split", "no.such.topic", "0"), "does not exist"),
        (("log", "shards", "no.such.topic"), "does not exist"),
    ]
    for args, text in cases:
        result = headwater(*args, cwd=tmp_path)
        assert result.returncode != 0, args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and text in lines[0], (args, result.stderr)
    assert (tmp_path / ".headwater" / "log" / TOPIC / "shards.json").read_bytes() == before
    records = orjson.loads(headwater("log", "topics", "--json", cwd=tmp_path).stdout)[0]["records"]
    assert records == 40


def test_kafka_backend_refuses_in_one_line_saying_why(tmp_path):
    (tmp_path / "headwater.yaml").write_text(
        "project: p\nlog:\n  backend: kafka\n  kafka:\n    bootstrap_servers: 127.0.0.1:1\n"
    )
    result = headwater("log", "split", TOPIC, "0", cwd=tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Kafka can only add partitions" in lines[0] and "KIP-253" in lines[0], result.stderr
