"""The pure parts of the sinks: config, inputs, filter, transform, backoff, webhook body and signature, replica rows."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import random
from decimal import Decimal
from pathlib import Path

import orjson
import pytest

from core.config import parse_config
from core.errors import ConfigError
from core.sink_config import TransformConfig
from log.base import StoredRecord
from log.row_types import LogicalKind, LogicalType
from sinks.backoff import Backoff
from sinks.errors import SinkConfigError
from sinks.event_filter import EventFilter
from sinks.inputs import resolve_inputs
from sinks.postgres.columns import converter, copy_rows, same
from sinks.records import SinkRecord, topic_fields
from sinks.transform import Transform, unknown_fields
from sinks.webhook import body, signature


def sinks(section):
    return parse_config({"project": "p", "sinks": section}, Path("headwater.yaml")).sinks


def test_each_kind_validates_its_own_options_and_names_the_field():
    parsed = sinks(
        {"hook": {"kind": "webhook", "from": "shop.*", "options": {"url": "https://h/x", "secret": "hmac-key-77"}}}
    )
    assert parsed["hook"].from_ == ("shop.*",)
    assert "hmac-key-77" not in repr(parsed["hook"])  # the HMAC key is a secret
    with pytest.raises(ConfigError, match=r"sinks\.hook\.options\.url: is required"):
        sinks({"hook": {"kind": "webhook", "from": "a"}})
    with pytest.raises(ConfigError, match=r"sinks\.r\.options\.dsn: unknown key"):
        sinks({"r": {"kind": "redis", "from": "a", "options": {"dsn": "x"}}})
    with pytest.raises(ConfigError, match=r"sinks\.r\.options\.stream: template '\{tpic\}' may name only"):
        sinks({"r": {"kind": "redis", "from": "a", "options": {"stream": "{tpic}"}}})
    with pytest.raises(ConfigError, match=r"sinks\.q\.kind: must be"):
        sinks({"q": {"kind": "kinesis", "from": "a"}})
    with pytest.raises(ConfigError, match=r"sinks\.r\.from: .*name one or more"):
        sinks({"r": {"kind": "redis", "from": []}})
    with pytest.raises(ConfigError, match=r"sinks: name 'bad-name'"):
        sinks({"bad-name": {"kind": "redis", "from": "a"}})


def test_globs_skip_internal_quarantine_and_dead_letter_topics_and_names_resolve():
    topics = [
        "shop.public.a",
        "shop.public.b",
        "shop.public.a.quarantine",
        "_headwater.schemas",
        "headwater.sink.out.dead_letter",
        "vip.v2",
    ]
    assert resolve_inputs("out", ["shop.*", "*"], topics) == ["shop.public.a", "shop.public.b", "vip.v2"]
    assert resolve_inputs("out", ["vip"], topics, {"vip": "vip.v2"}.get) == ["vip.v2"]
    assert resolve_inputs("out", ["headwater.sink.out.dead_letter"], topics) == []  # never its own
    assert resolve_inputs("x", ["headwater.sink.out.dead_letter"], topics) == ["headwater.sink.out.dead_letter"]


def record(offset, value, key=b'{"id":1}', topic="s.public.t", partition=0):
    return StoredRecord(topic, partition, offset, 1_700_000_000_000, key, orjson.dumps(value))


def test_the_filter_is_sql_over_the_event_with_typed_reads():
    events = [
        record(0, {"op": "c", "after": {"id": 1, "total": "12.30"}}),
        record(1, {"op": "d", "before": {"id": 1}}),
        record(2, {"op": "u", "after": {"id": 2, "total": "9.99"}}),
        record(3, {"op": "u", "after": {"id": 3, "total": None}}),
    ]
    keep = EventFilter("s", "op <> 'd' AND (after->>'total')::DECIMAL(10,2) > 10")
    assert keep.keep(events) == [True, False, False, False]  # null is not true
    assert EventFilter("s", "\"offset\" >= 2 AND topic LIKE 's.%'").keep(events) == [False, False, True, True]
    with pytest.raises(SinkConfigError, match=r"sinks\.s\.filter: 'no_such_column = 1' cannot be evaluated"):
        EventFilter("s", "no_such_column = 1")


def test_transform_flattens_and_chooses_fields():
    event = {"op": "d", "before": {"id": 1, "a": 2, "b": 3}, "after": None, "source": {"ts_ms": 5}}
    flat = Transform(TransformConfig(flatten=True, fields=("id", "b")))
    assert flat.apply("s.public.t", event) == {
        "id": 1,
        "b": 3,
        "__op": "d",
        "__topic": "s.public.t",
        "__deleted": True,
        "__source_ts_ms": 5,
    }
    narrow = Transform(TransformConfig(fields=("a",)))
    assert narrow.apply("t", {"op": "c", "before": None, "after": {"id": 1, "a": 2}}) == {
        "op": "c",
        "before": None,
        "after": {"a": 2},
    }
    same = Transform(TransformConfig())
    assert same.identity and same.payload("t", b'{"op":"c"}') == b'{"op":"c"}'
    assert unknown_fields(("a", "zz"), {"t1": ["a", "b"], "t2": ["c"]}) == ["zz"]


def test_backoff_grows_is_jittered_and_capped():
    backoff = Backoff(0.5, 4.0, random.Random(1))
    delays = [backoff.next_delay() for _ in range(8)]
    for delay, ceiling in zip(delays, [0.5, 1, 2, 4, 4, 4, 4, 4], strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert len(set(delays)) == len(delays)  # jittered
    backoff.reset()
    assert backoff.next_delay() <= 0.5


def test_webhook_body_is_the_stored_json_and_the_signature_is_hmac_sha256():
    records = [
        SinkRecord("s.public.t", 2, 7, 1000, b'{"id":1}', b"{}", b'{"op":"c"}'),
        SinkRecord("s.public.t", 0, 8, 1001, None, b"{}", b'{"op":"m"}'),
    ]
    payload = body(records)
    assert orjson.loads(payload) == [
        {"id": "s.public.t/2/7", "topic": "s.public.t", "partition": 2, "offset": 7, "timestamp_ms": 1000,
         "key": {"id": 1}, "value": {"op": "c"}},
        {"id": "s.public.t/0/8", "topic": "s.public.t", "partition": 0, "offset": 8, "timestamp_ms": 1001,
         "key": None, "value": {"op": "m"}},
    ]  # fmt: skip
    expected = hmac.new(b"k", b"1700000000." + payload, hashlib.sha256).hexdigest()
    assert signature(b"k", payload, 1_700_000_000) == f"t=1700000000,v1={expected}"


def test_templates_name_the_parts_of_a_topic():
    assert topic_fields("shop.public.orders") == {
        "topic": "shop.public.orders",
        "source": "shop",
        "schema": "public",
        "table": "orders",
    }
    assert topic_fields("vip")["table"] == "vip"


def test_run_follow_supervises_a_sinks_stage_when_sinks_are_configured():
    from operations.pipeline import follow_stages

    config = parse_config({"project": "p", "sinks": {"r": {"kind": "redis", "from": "a"}}}, Path("/x/headwater.yaml"))
    stages = {stage.name: stage.argv for stage in follow_stages(config, Path("/x/headwater.yaml"))}
    assert stages["sinks"][-2:] == ["run", "--follow"]
    assert "sinks" not in {s.name for s in follow_stages(parse_config({"project": "p"}, Path("h.yaml")), Path("h"))}


def test_replica_rows_convert_typed_columns_and_take_the_others_as_they_are():
    converters = {
        "id": same,
        "day": converter(LogicalType(LogicalKind.DATE)),
        "at": converter(LogicalType(LogicalKind.TIMESTAMP_US)),
        "price": converter(LogicalType(LogicalKind.DECIMAL_BASE64, precision=10, scale=2)),
        "note": converter(LogicalType(LogicalKind.STRING)),
    }
    rows = [
        {"id": 1, "day": 19_000, "at": 1_500_000, "price": "MDk=", "note": "x", "extra": "ignored"},
        {"id": 2, "day": None},  # missing and null values are null, never converted
    ]
    got = list(copy_rows(rows, ["note", "price", "id", "day", "at"], converters))
    assert got == [
        ["x", Decimal("123.45"), 1, dt.date(2022, 1, 8), dt.datetime(1970, 1, 1, 0, 0, 1, 500_000)],
        [None, None, 2, None, None],
    ]
