import subprocess
import sys

import orjson

from log.base import Record, TopicSpec, append_keyed
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
