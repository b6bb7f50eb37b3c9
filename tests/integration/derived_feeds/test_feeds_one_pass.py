"""One Spark pass per micro-batch (``transform.paired_rows``) makes exactly the events of the general path.

The general path runs the feed's SQL over the current images, collects the SQL's rows and
the latest changes separately and pairs them on the driver by the key's JSON. The one pass
evaluates a projection/filter SQL on each change's own row. Both run here on the session
Spark over the same latest changes (deletes, truncates, inserts that never passed, nulls,
quotes and non-ASCII text, decimals, a drop expectation) and must encode the same events.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import orjson
import pytest
import yaml
from harness.topics import topic_records
from pyspark.sql.types import StructType

from capture.postgres.events.source_block import postgres_source
from core.config import ExpectationConfig, load_config
from derived_feeds import transform
from derived_feeds.expectations import compile_checks
from derived_feeds.feed_job import _unique_key, run_feeds
from derived_feeds.feed_output import encode_output, pair_changes, paired_output
from derived_feeds.feed_spec import feed_spec
from log.base import Record, TopicSpec, append_keyed
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from log.factory import open_log
from log.topics import SCHEMAS_TOPIC

LATEST = (
    "__hw_image struct<id:bigint,name:string,balance:decimal(10,2),country:string>, op string, "
    "__hw_first_op string, __hw_seq string, commit_lsn bigint, txn_index bigint, commit_ts timestamp, "
    "snapshot string, source_db string, source_schema string, source_table string"
)
CHANGES = [
    ((1, "Ann", Decimal("5.00"), "PT"), "c", "c"),  # insert that passes
    ((2, "Bob", Decimal("-1.00"), "DE"), "u", "c"),  # first seen as insert, fails the filter: nothing
    ((3, 'C"y\\', Decimal("-2.00"), "DE"), "u", "u"),  # fails the filter now: delete
    ((4, None, None, None), "d", "u"),  # deleted (before image: key only)
    (None, "t", "t"),  # truncate
    ((5, "Dée ☃", Decimal("7.00"), None), "r", "r"),  # snapshot read, null country
    ((6, "EVE", Decimal("0.00"), "MX"), "u", "d"),
    ((7, None, Decimal("3.50"), "US"), "u", "u"),  # null name: fails the drop expectation
]
ONE_PASS = [
    "SELECT id, lower(name) AS name, country FROM source WHERE balance >= 0",
    "SELECT * FROM source",
    "SELECT * FROM source WHERE country IS NOT NULL",
    "SELECT upper(name) AS name, id FROM (SELECT * FROM source WHERE balance >= 0) WHERE country <> 'MX'",
    "SELECT id, concat(name, '!') AS name, balance * 2 AS balance FROM source WHERE id % 2 = 1 AND balance > 0",
]
GENERAL = [
    "SELECT id, name FROM source WHERE id IN (SELECT id FROM source WHERE balance > 0)",  # subquery
    "SELECT id, max(name) AS name FROM source GROUP BY id",  # aggregate
    "SELECT id + 0 AS id, name FROM source",  # key not passed through unchanged
    "SELECT s.id, t.name FROM source s JOIN source t ON s.id = t.id",  # join
    "SELECT id, name FROM (SELECT id, upper(name) AS name FROM source) WHERE name <> 'ANN'",  # computed below
    "SELECT * FROM source UNION ALL SELECT 9, 'x', 1.0, 'y'",  # fails over the rows with the hidden column
]


@pytest.fixture
def latest(spark):
    ts = dt.datetime(2026, 1, 2, 3, 4, 5, 678901)
    rows = [
        (image, op, first, f"{i:016x}", 100 + i, i, ts, "false", "db", "public", "t")
        for i, (image, op, first) in enumerate(CHANGES)
    ]
    return spark.createDataFrame(rows, LATEST)


def general_events(spark, latest, sql, checks):
    output = transform.apply_sql(spark, transform.current_images(latest), sql)
    image = latest.schema["__hw_image"].dataType
    changes = transform.change_rows(latest, ["id"]).toArrow()
    outputs = transform.output_rows(output, ["id"], image, checks).toArrow()
    return encode_output(pair_changes(changes, outputs, checks), "f", checks)


def output_of(spark, latest, sql) -> StructType:
    return transform.apply_sql(spark, transform.current_images(latest), sql).schema


def sorted_rows(table):
    return sorted(table.to_pylist(), key=lambda row: (row["key"] or "", row["op"]))


@pytest.mark.parametrize("sql", ONE_PASS)
def test_one_pass_makes_the_events_of_the_general_path(spark, latest, sql):
    output = output_of(spark, latest, sql)
    expectations = [{"expect": "expect_column_values_to_not_be_null", "column": "name", "action": "drop"}]
    checks = compile_checks("f", [ExpectationConfig.model_validate(e) for e in expectations], output)

    paired = transform.paired_rows(spark, latest, sql, ["id"], output, checks=checks)

    assert paired is not None
    one_pass = encode_output(paired_output(paired.toArrow(), checks), "f", checks)
    general = general_events(spark, latest, sql, checks)
    assert sorted_rows(one_pass) == sorted_rows(general)
    assert general.num_rows >= 4  # upserts, deletes and the truncate are all there


@pytest.mark.parametrize("sql", GENERAL)
def test_sql_that_is_not_projections_and_filters_over_source_takes_the_general_path(spark, latest, sql):
    output = output_of(spark, latest, sql)
    assert transform.paired_rows(spark, latest, sql, ["id"], output, checks=[]) is None
    one_pass = transform.OnePass(sql, ["id"], output, [], latest_of=lambda frame: frame)
    assert one_pass.paired(latest) is None
    assert one_pass.paired(latest) is None
    assert one_pass.plans == 1  # the decision is kept for this input


def events_of(spark, paired, checks):
    return sorted_rows(encode_output(paired_output(paired.toArrow(), checks), "f", checks))


def with_image(spark, latest, image_type: str, image):
    """``latest`` after a schema change of the source: the same changes, each image mapped by ``image``."""
    rows = [(None if row[0] is None else image(row[0]), *list(row)[1:]) for row in latest.collect()]
    return spark.createDataFrame(rows, f"__hw_image {image_type}, " + LATEST.split(", ", 1)[1])


def balance_as_double(image):
    return (image[0], image[1], None if image[2] is None else float(image[2]) + 0.25, image[3])


def test_one_pass_is_planned_once_per_input_and_again_after_a_schema_change(spark, latest):
    """Batches with the same columns reuse the planned pass; a changed column type or a new column plans anew.

    A cache keyed by the SQL alone would run the first input's plan over the second's
    columns (the old type, or without the new column): these rows would then differ from
    the general path's, or Spark would refuse the plan.
    """
    sql = "SELECT id, lower(name) AS name, balance FROM source WHERE balance >= 0"
    expectations = [{"expect": "expect_column_values_to_not_be_null", "column": "name", "action": "drop"}]
    output = output_of(spark, latest, sql)
    checks = compile_checks("f", [ExpectationConfig.model_validate(e) for e in expectations], output)
    one_pass = transform.OnePass(sql, ["id"], output, checks, latest_of=lambda frame: frame)

    first = events_of(spark, one_pass.paired(latest), checks)
    fewer = latest.where("txn_index <> 0")  # another batch of the same input: other rows, same columns
    reused = events_of(spark, one_pass.paired(fewer), checks)
    assert one_pass.plans == 1
    assert first == sorted_rows(general_events(spark, latest, sql, checks))
    assert reused == sorted_rows(general_events(spark, fewer, sql, checks))
    assert len(reused) == len(first) - 1

    # balance: decimal(10,2) -> double (same output names, other types)
    retyped = with_image(
        spark,
        latest,
        "struct<id:bigint,name:string,balance:double,country:string>",
        balance_as_double,
    )
    events = events_of(spark, one_pass.paired(retyped), checks)
    assert one_pass.plans == 2
    assert events == sorted_rows(general_events(spark, retyped, sql, checks))
    assert '"balance":5.25' in "".join(row["value"] or "" for row in events)

    # a new source column, read by SELECT *: the feed's output has it (planned from the new schema)
    star = "SELECT * FROM source WHERE balance >= 0"
    widened = with_image(
        spark,
        latest,
        "struct<id:bigint,name:string,balance:decimal(10,2),country:string,tier:int>",
        lambda image: (*image, image[0] * 10),
    )
    star_pass = transform.OnePass(star, ["id"], output_of(spark, widened, star), [], latest_of=lambda frame: frame)
    assert star_pass.paired(latest) is None  # the old columns do not make the planned output: general path
    events = events_of(spark, star_pass.paired(widened), [])
    assert star_pass.plans == 2
    assert events == sorted_rows(general_events(spark, widened, star, []))
    assert '"tier":10' in "".join(row["value"] or "" for row in events)


def test_one_pass_only_where_the_feed_key_holds_the_source_key(tmp_path):
    body = {
        "project": "p",
        "home": str(tmp_path / "home"),
        "feeds": {
            "by_id": {"from": "s.public.t", "sql": "SELECT * FROM source", "key": ["id"]},
            "by_country": {"from": "s.public.t", "sql": "SELECT * FROM source", "key": ["country"]},
            "by_id_country": {"from": "s.public.t", "sql": "SELECT * FROM source", "key": ["id", "country"]},
            "keyless": {"from": "s.public.k", "sql": "SELECT * FROM source", "key": ["id"]},
        },
    }
    path = tmp_path / "headwater.yaml"
    path.write_text(yaml.safe_dump(body))
    config = load_config(path)
    log = open_log(config)
    try:
        log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))

        def schema(topic, key):
            columns = [{"name": n, "type_oid": 25, "typmod": -1, "key": n in key} for n in ("id", "country")]
            return Record(topic.encode(), orjson.dumps({"topic": topic, "columns": columns, "version": 1}))

        append_keyed(log, SCHEMAS_TOPIC, [schema("s.public.t", {"id"}), schema("s.public.k", set())])
        unique = {name: _unique_key(log, feed_spec(config, name)) for name in body["feeds"]}
    finally:
        log.close()
    assert unique == {"by_id": True, "by_country": False, "by_id_country": True, "keyless": False}


TOPIC = "s.public.customers"
COLUMNS = [("id", 20, -1, True), ("name", 25, -1, False), ("country", 25, -1, False), ("balance", 1700, 655366, False)]


def write_changes(log) -> None:
    """Inserts, updates (some failing the filter), deletes and null names over 30 keys, in 120 changes."""
    log.create_topic(TopicSpec(TOPIC, partitions=2))
    log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
    columns = [{"name": n, "type_oid": o, "typmod": t, "key": k} for n, o, t, k in COLUMNS]
    schema = {"topic": TOPIC, "schema": "public", "table": "customers", "columns": columns, "version": 1}
    append_keyed(log, SCHEMAS_TOPIC, [Record(TOPIC.encode(), orjson.dumps(schema))])
    changes = []
    for i in range(120):
        key = (i * 7) % 30
        source = postgres_source("s", "s", "public", "customers", i, i, 1_000 + i, 0, 1_700_000_000_000_000 + i)
        if i % 11 == 10:
            event = ChangeEvent(Op.DELETE, source, {"id": key}, None, 0)
        else:
            name = None if i % 13 == 0 else f'Na"me-{i}-é'
            after = {"id": key, "name": name, "country": ["PT", "DE", None][i % 3], "balance": f"{(i % 9) - 3}.50"}
            event = ChangeEvent(Op.CREATE if i < 30 else Op.UPDATE, source, None, after, 0)
        changes.append(Record(encode_key({"id": key}), encode_value(event)))
    for start in range(0, len(changes), 25):  # several appends: several micro-batches of 40
        append_keyed(log, TOPIC, changes[start : start + 25])


def feed_records(log, topic: str) -> list:
    """The topic's records as comparable values: key, value without the feed's name, headers' names."""
    out = []
    for partition, records in topic_records(log, topic).items():
        for record in records:
            value = orjson.loads(record.value) if record.value is not None else None
            if isinstance(value, dict) and isinstance(value.get("source"), dict):
                value["source"].pop("name")
            headers = sorted(k for k, _ in record.headers if not k.startswith("headwater.batch"))
            out.append((partition, record.key, orjson.dumps(value, option=orjson.OPT_SORT_KEYS), headers))
    return sorted(out, key=repr)


def feed_project(tmp_path, feeds):
    """A project in ``tmp_path`` with these feeds over a 2-partition file log: its config and open log."""
    path = tmp_path / "headwater.yaml"
    body = {"project": "p", "home": str(tmp_path / "home"), "log": {"partitions": 2}, "feeds": feeds}
    path.write_text(yaml.safe_dump(body))
    config = load_config(path)
    return config, open_log(config)


def _folded(log, topic: str) -> dict:
    """The topic applied in log order (a sink's view): key -> the row, deleted keys removed."""
    state: dict = {}
    for records in topic_records(log, topic).values():  # a key's records are in one partition, in order
        for record in records:
            event = orjson.loads(record.value) if record.value is not None else None
            if event is None or event["op"] == "d":
                state.pop(record.key, None)
            else:
                state[record.key] = event["after"]
    return state


def test_the_one_pass_and_the_same_sql_as_a_maintained_view_hold_the_same_rows(spark, tmp_path):
    """ORDER BY keeps the SQL off the one pass: the feed is a maintained view, with the same rows and fewer records.

    The one pass is stateless (a row failing the filter gets a delete whether or not it was in
    the feed, an update of unselected columns an update); the maintained view writes only
    differences.
    """
    sql = "SELECT id, lower(name) AS name, country FROM source WHERE balance >= 0"
    expectation = {"expect": "expect_column_values_to_not_be_null", "column": "name", "action": "drop"}
    feeds = {
        "one": {"from": TOPIC, "sql": sql, "key": ["id"], "expectations": [expectation]},
        "view": {"from": TOPIC, "sql": f"{sql} ORDER BY id", "key": ["id"], "expectations": [expectation]},
    }
    config, log = feed_project(tmp_path, feeds)
    try:
        write_changes(log)
        started = run_feeds(spark, config, log, ["one", "view"], available_now=True, max_records_per_batch=40)
        plans = {plan.spec.name: plan for _, plan in started}
        stats = {name: plan.stats for name, plan in plans.items()}
        one, view = (feed_records(log, plans[name].spec.topic) for name in ("one", "view"))
        quarantined = [feed_records(log, plans[name].spec.quarantine_topic) for name in ("one", "view")]
        folded = [_folded(log, plans[name].spec.topic) for name in ("one", "view")]
    finally:
        log.close()
    assert stats["one"]["batches"] >= 3
    assert stats["one"]["one_pass"] == stats["one"]["batches"]
    assert plans["one"].one_pass.plans == 1  # planned at the first batch, reused by the others
    assert (str(plans["one"].plan_class), str(plans["view"].plan_class)) == ("projection", "projection (maintained)")
    assert stats["view"]["one_pass"] == 0
    assert stats["one"]["deletes"] > 0
    assert stats["one"]["dropped"] > 0
    assert folded[0] == folded[1]
    assert 0 < len(view) < len(one)
    assert len(quarantined[0]) == stats["one"]["dropped"]
    assert {r[1] for r in quarantined[1]} <= {r[1] for r in quarantined[0]}


def test_a_source_column_added_mid_stream_reaches_the_feed_from_the_next_query_on(spark, tmp_path):
    """A plain feed's ``SELECT *`` across a new schema version of its source (as capture writes on a new Relation).

    A streaming query's input columns are fixed when it starts, so the change takes effect at
    the next query: its one pass is planned for the new columns (not the old query's plan), and
    its events carry the new column (both paths alike: the transform-level test above).
    """
    feeds = {"one": {"from": TOPIC, "sql": "SELECT * FROM source WHERE balance >= 0", "key": ["id"]}}
    config, log = feed_project(tmp_path, feeds)
    try:
        write_changes(log)
        [(_, before)] = run_feeds(spark, config, log, ["one"], available_now=True, max_records_per_batch=200)
        columns = [*COLUMNS, ("tier", 23, -1, False)]
        described = [{"name": n, "type_oid": o, "typmod": t, "key": k} for n, o, t, k in columns]
        schema = {"topic": TOPIC, "schema": "public", "table": "customers", "columns": described, "version": 2}
        append_keyed(log, SCHEMAS_TOPIC, [Record(TOPIC.encode(), orjson.dumps(schema))])
        changes = []
        for i in range(120, 150):  # one change per key: each is its key's latest however the batches split
            source = postgres_source("s", "s", "public", "customers", i, i, 1_000 + i, 0, 1_700_000_000_000_000 + i)
            after = {"id": i % 30, "name": f"N{i}", "country": "PT", "balance": f"{(i % 5) - 1}.00", "tier": i}
            event = ChangeEvent(Op.UPDATE, source, None, after, 0)
            changes.append(Record(encode_key({"id": i % 30}), encode_value(event)))
        append_keyed(log, TOPIC, changes)
        [(_, plan)] = run_feeds(spark, config, log, ["one"], available_now=True, max_records_per_batch=20)
        records = feed_records(log, plan.spec.topic)
    finally:
        log.close()
    assert "tier" not in before.output.fieldNames()
    assert "tier" in plan.output.fieldNames()
    assert plan.stats["batches"] >= 2
    assert plan.stats["one_pass"] == plan.stats["batches"]
    assert plan.one_pass.plans == 1
    assert (plan.stats["upserts"], plan.stats["deletes"]) == (24, 6)  # balance -1 where i % 5 == 0
    afters = [(orjson.loads(value) or {}).get("after") for _, _, value, _ in records]  # null: tombstones
    new = {after["id"]: after for after in afters if after is not None and "tier" in after}
    assert new == {
        i % 30: {"id": i % 30, "name": f"N{i}", "country": "PT", "balance": f"{(i % 5) - 1}.00", "tier": i}
        for i in range(120, 150)
        if i % 5 != 0
    }
