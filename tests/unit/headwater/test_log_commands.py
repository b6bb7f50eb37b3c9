import subprocess
import sys

import orjson

from log.base import Record, TopicPartition, TopicSpec, append_keyed
from log.file.backend import FileLog


def headwater(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "headwater", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def populate(tmp_path):
    (tmp_path / "headwater.yaml").write_text("project: p\n")
    log = FileLog(tmp_path / ".headwater" / "log")
    log.create_topic(TopicSpec("shop.public.t", partitions=2))
    append_keyed(
        log,
        "shop.public.t",
        [
            Record(b'{"id":1}', b'{"op":"c","after":{"id":1}}', (("h", b"v"),), timestamp_ms=1000),
            Record(b'{"id":2}', b'{"op":"c","after":{"id":2}}', timestamp_ms=2000),
            Record(b'{"id":1}', None, timestamp_ms=3000),
        ],
    )
    log.close()


def test_tail_json_is_the_documented_format(tmp_path):
    populate(tmp_path)
    result = headwater("log", "tail", "shop.public.t", "--from-beginning", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 3
    assert all(
        set(line) == {"topic", "partition", "offset", "timestamp_ms", "key", "value", "headers"} for line in lines
    )
    first = next(line for line in lines if line["headers"])
    assert first["key"] == {"id": 1}
    assert first["value"] == {"op": "c", "after": {"id": 1}}
    assert first["headers"] == {"h": "v"}
    tombstone = next(line for line in lines if line["value"] is None)
    assert tombstone["key"] == {"id": 1}
    assert tombstone["timestamp_ms"] == 3000
    limited = headwater("log", "tail", "shop.public.t", "--from-beginning", "--json", "--limit", "1", cwd=tmp_path)
    assert len(limited.stdout.splitlines()) == 1


def test_topics_json_and_compact(tmp_path):
    populate(tmp_path)
    result = headwater("log", "topics", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    topics = {t["topic"]: t for t in orjson.loads(result.stdout)}
    assert topics["shop.public.t"]["partitions"] == 2
    assert topics["shop.public.t"]["records"] == 3
    assert topics["shop.public.t"]["cleanup_policy"] == "compact"
    compacted = headwater("log", "compact", "shop.public.t", cwd=tmp_path)
    assert compacted.returncode == 0, compacted.stderr
    assert "shop.public.t:" in compacted.stdout


def test_unknown_topic_is_one_line(tmp_path):
    (tmp_path / "headwater.yaml").write_text("project: p\n")
    result = headwater("log", "tail", "nope", cwd=tmp_path)
    assert result.returncode == 3  # a permanent error: retrying will not help
    assert result.stderr.strip().splitlines() == [
        "error: topic 'nope' does not exist; list topics with 'headwater log topics'"
    ]


def test_groups_list_describe_and_unknown(tmp_path):
    populate(tmp_path)
    log = FileLog(tmp_path / ".headwater" / "log")
    log.commit("billing", {TopicPartition("shop.public.t", 0): 1})
    log.close()
    listed = headwater("log", "groups", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [row["group"] for row in orjson.loads(listed.stdout)] == ["billing"]
    described = headwater("log", "groups", "billing", "--json", cwd=tmp_path)
    assert described.returncode == 0, described.stderr
    body = orjson.loads(described.stdout)
    assert body["state"] == "empty" and body["members"] == []
    assert {(p["partition"], p["committed"]) for p in body["partitions"]} == {(0, 1), (1, None)}
    assert "billing" in headwater("log", "groups", "billing", cwd=tmp_path).stdout
    unknown = headwater("log", "groups", "nope", cwd=tmp_path)
    assert unknown.returncode == 3
    assert unknown.stderr.strip().splitlines() == [
        "error: consumer group 'nope' does not exist; list groups with 'headwater log groups'"
    ]


def test_tail_follow_bad_input_is_one_line(tmp_path):
    populate(tmp_path)
    no_follow = headwater("log", "tail", "shop.public.t", "--group", "g", cwd=tmp_path)
    assert no_follow.returncode == 2 and "--group needs --follow" in no_follow.stderr
    unknown = headwater("log", "tail", "nope", "--follow", "--group", "g", cwd=tmp_path)
    assert unknown.returncode == 3
    assert unknown.stderr.strip().splitlines() == [
        "error: topic 'nope' does not exist; list topics with 'headwater log topics'"
    ]
    bad_group = headwater("log", "tail", "shop.public.t", "--follow", "--group", "a b", cwd=tmp_path)
    assert bad_group.returncode == 3 and bad_group.stderr.count("\n") == 1
    assert "invalid consumer group name 'a b'" in bad_group.stderr


def test_tail_follow_prints_the_last_records_then_new_ones(tmp_path):
    populate(tmp_path)
    limited = headwater("log", "tail", "shop.public.t", "--follow", "--json", "--limit", "3", cwd=tmp_path)
    assert limited.returncode == 0, limited.stderr
    assert len(limited.stdout.splitlines()) == 3


def test_clean_once_and_bad_topics_config(tmp_path):
    populate(tmp_path)
    (tmp_path / "headwater.yaml").write_text("project: p\nlog:\n  topics:\n    'shop.*': {min_compaction_lag_ms: 0}\n")
    cleaned = headwater("log", "clean", cwd=tmp_path)
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.strip() == "nothing to clean"  # one active segment per partition
    unknown = headwater("log", "clean", "nope", cwd=tmp_path)
    assert unknown.returncode == 3 and "topic 'nope' does not exist" in unknown.stderr
    (tmp_path / "headwater.yaml").write_text("project: p\nlog:\n  topics:\n    'shop.*': {cleanup: sometimes}\n")
    bad = headwater("log", "clean", cwd=tmp_path)
    assert bad.returncode == 3
    assert bad.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'headwater.yaml'}: log.topics.shop.*.cleanup: "
        "must be 'compact', 'delete' or 'compact,delete', got 'sometimes'"
    ]
