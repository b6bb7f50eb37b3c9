"""Plan classes from Spark's analyzed plan: which SQL a feed maintains, and the one line that refuses the rest."""

from __future__ import annotations

import pytest
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from core.config import loaded_config_name
from derived_feeds.catalyst import HIDDEN_PREFIX, Catalyst, analyzed
from derived_feeds.errors import FeedConfigError
from derived_feeds.plan_class import PlanClass, classify
from derived_feeds.transform import SOURCE_VIEW, apply_sql

ORDERS = StructType(
    [StructField(n, t) for n, t in [("id", IntegerType()), ("status", StringType()), ("amount", IntegerType())]]
    + [StructField("cid", IntegerType())]
)
CUSTOMERS = StructType([StructField("id", IntegerType()), StructField("country", StringType())])
JOIN = "FROM source o JOIN customers c ON o.cid = c.id"


def shape(spark, sql: str, key: list[str], source_key: list[str] | None = None):
    def empty(view: str, struct: StructType):
        return spark.createDataFrame([], StructType([*struct.fields, StructField(HIDDEN_PREFIX + view, StringType())]))

    frame = apply_sql(spark, empty(SOURCE_VIEW, ORDERS), sql, {"customers": empty("customers", CUSTOMERS)})
    return classify(Catalyst(spark), "f", analyzed(frame), key, source_key or ["id"])


@pytest.mark.parametrize(
    ("sql", "key", "plan_class", "unique"),
    [
        ("SELECT id, amount FROM source WHERE amount > 0", ["id"], PlanClass.REKEYED, True),
        ("SELECT amount * 2 AS twice, status FROM source", ["twice"], PlanClass.REKEYED, False),
        ("SELECT id, amount FROM source ORDER BY amount", ["id"], PlanClass.REKEYED, True),
        (f"SELECT o.id, c.country {JOIN}", ["id"], PlanClass.JOIN, True),
        (
            "SELECT o.id, c.country FROM source o LEFT JOIN customers c ON o.cid = c.id",
            ["country"],
            PlanClass.JOIN,
            False,
        ),
        ("SELECT c.country, o.id FROM customers c RIGHT JOIN source o ON o.cid = c.id", ["id"], PlanClass.JOIN, True),
        ("SELECT o.id FROM source o LEFT SEMI JOIN customers c ON o.cid = c.id", ["id"], PlanClass.JOIN, True),
        ("SELECT status, count(*) n, sum(amount) s FROM source GROUP BY status", ["status"], PlanClass.AGGREGATE, True),
        ("SELECT status, count(*) n FROM source GROUP BY status", ["n"], PlanClass.AGGREGATE, False),
        (
            "SELECT upper(status) AS s, avg(amount) a, min(amount), max(amount), count(DISTINCT cid) "
            "FROM source WHERE amount > 0 GROUP BY upper(status) HAVING count(*) > 1",
            ["s"],
            PlanClass.AGGREGATE,
            True,
        ),
        (
            "SELECT s, n FROM (SELECT status s, count(*) n FROM source GROUP BY status)",
            ["s"],
            PlanClass.AGGREGATE,
            True,
        ),
        ("SELECT count(*) AS n FROM source", ["n"], PlanClass.AGGREGATE, True),
        (f"SELECT c.country, count(*) AS n {JOIN} GROUP BY c.country", ["country"], PlanClass.AGGREGATE_JOIN, True),
        ("SELECT DISTINCT status, cid FROM source", ["status", "cid"], PlanClass.DISTINCT, True),
        ("SELECT DISTINCT status, cid FROM source", ["status"], PlanClass.DISTINCT, False),
    ],
)
def test_maintained_sql_has_its_plan_class(spark, sql, key, plan_class, unique):
    found = shape(spark, sql, key)
    assert (found.plan_class, found.unique_by_plan) == (plan_class, unique)
    assert found.grouped == (plan_class in (PlanClass.AGGREGATE, PlanClass.AGGREGATE_JOIN, PlanClass.DISTINCT))


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("SELECT id, rand() AS r FROM source", "rand() is not deterministic"),
        ("SELECT id, uuid() AS u FROM source", "uuid() is not deterministic"),
        ("SELECT id, current_timestamp() AS t FROM source", "current_timestamp() is not deterministic"),
        ("SELECT id FROM source WHERE amount > rand()", "rand() is not deterministic"),
        ("SELECT id, row_number() OVER (ORDER BY amount) AS r FROM source", "window function"),
        ("SELECT id, sum(amount) OVER (PARTITION BY status) AS s FROM source", "window function"),
        ("SELECT id FROM source LIMIT 10", "LIMIT is not maintained"),
        ("SELECT id FROM source ORDER BY id LIMIT 10", "LIMIT is not maintained"),
        ("SELECT id FROM source WHERE cid IN (SELECT id FROM customers)", "subquery"),
        ("SELECT id FROM source UNION ALL SELECT id FROM source", "UNION is not maintained"),
        ("SELECT id, explode(array(1, 2)) AS x FROM source", "generator"),
        ("SELECT status, cid, count(*) AS n FROM source GROUP BY ROLLUP(status, cid)", "GROUPING SETS"),
        ("SELECT n, count(*) AS m FROM (SELECT status, count(*) n FROM source GROUP BY status) GROUP BY n", "over an"),
        ("SELECT o.id, c.country FROM source o FULL JOIN customers c ON o.cid = c.id", "FULL JOIN"),
        ("SELECT o.id FROM source o LEFT ANTI JOIN customers c ON o.cid = c.id", "anti join"),
        ("SELECT c.country, o.id FROM customers c LEFT JOIN source o ON o.cid = c.id", "may lose rows"),
        ("SELECT a.id, b.amount AS other FROM source a JOIN source b ON a.cid = b.cid", "read 2 times"),
        ("SELECT status, first(amount) AS f FROM source GROUP BY status", "first()"),
        ("SELECT status, collect_list(amount) AS l FROM source GROUP BY status", "collect_list()"),
        ("SELECT o.id, c.id FROM source o JOIN customers c ON o.cid = c.id", "'id' appears twice"),
    ],
)
def test_what_cannot_be_maintained_is_refused_in_one_line(spark, sql, named):
    with pytest.raises(FeedConfigError) as refused:
        shape(spark, sql, ["id"])
    message = str(refused.value)
    assert named in message, message
    assert "\n" not in message
    assert message.startswith(f"{loaded_config_name()}: feeds.f.sql: ")
