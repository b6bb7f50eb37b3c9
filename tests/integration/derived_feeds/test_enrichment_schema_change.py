"""An enriched feed across a schema change of its source and of its lookup (a column added).

Capture writes a new schema version to ``_headwater.schemas`` when a table's columns
change mid-stream; the enrichment state (Spark's state store) was built with the old row
type. The feed must go on with the new columns, or stop with one line saying what to do.
"""

from __future__ import annotations

import orjson
from test_enrichment_state import COLUMNS, Shop

from log.base import Record
from log.pg_types import Oid
from log.topics import SCHEMAS_TOPIC


def add_column(shop: Shop, table: str, name: str, oid: Oid) -> None:
    """Write schema version 2 of ``table`` with one more column (as capture does for a new Relation)."""
    columns = [*COLUMNS[table], (name, oid, False)]
    described = [{"name": n, "type_oid": int(t), "typmod": -1, "key": k} for n, t, k in columns]
    value = {"topic": shop.topics[table], "schema": "public", "table": table, "columns": described, "version": 2}
    with shop.log() as log:
        log.append(SCHEMAS_TOPIC, 0, [Record(shop.topics[table].encode(), orjson.dumps(value))])


def test_lookup_and_source_gain_a_column_mid_stream(spark, unique_name, tmp_path):
    shop = Shop(tmp_path, unique_name("shop"))
    shop.upsert("customers", {"id": 1, "country": "PT"}, {"id": 2, "country": "DE"})
    shop.upsert("orders", {"id": 10, "customer_id": 1, "amount": 100}, {"id": 11, "customer_id": 2, "amount": 5})
    shop.run(spark)
    assert shop.fold() == shop.expected()

    add_column(shop, "customers", "tier", Oid.TEXT)
    shop.upsert("customers", {"id": 1, "country": "ES", "tier": "gold"})
    add_column(shop, "orders", "note", Oid.TEXT)
    shop.upsert("orders", {"id": 12, "customer_id": 2, "amount": 7, "note": "new"})
    shop.run(spark)
    assert shop.fold() == shop.expected()
