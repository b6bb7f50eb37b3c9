"""Asset keys and upstreams derived from headwater.yaml (no Dagster run, no services)."""

from __future__ import annotations

from dagster import AssetKey

from core.config import parse_config
from dagster_project.lineage import feed_key, source_topics, topic_key, upstream_key, warehouse_key


def config(tmp_path):
    return parse_config(
        {
            "project": "shop",
            "sources": {
                "shop": {"dsn": "postgresql://u@h/db", "tables": ["public.customers", "orders"]},
                "crm": {"dsn": "postgresql://u@h/crm", "schemas": ["sales"]},
            },
            "feeds": {
                "customers_clean": {"from": "shop.public.customers", "sql": "SELECT * FROM source", "key": ["id"]},
                "vip": {"from": "customers_clean", "sql": "SELECT * FROM source", "key": ["id"]},
            },
            "warehouse": {
                "tables": {
                    "customers": {"from": "customers_clean"},
                    "accounts_hist": {"from": "crm.sales.accounts", "mode": "scd2"},
                }
            },
        },
        tmp_path / "headwater.yaml",
    )


def test_topics_come_from_tables_and_from_references(tmp_path):
    assert source_topics(config(tmp_path)) == {
        "shop": ["shop.public.customers", "shop.public.orders"],
        "crm": ["crm.sales.accounts"],  # schemas: only what something reads is known before capture
    }


def test_keys_and_upstreams(tmp_path):
    cfg = config(tmp_path)
    assert topic_key("shop.public.customers") == AssetKey(["shop", "public", "customers"])
    assert topic_key("shop.public.my-table") == AssetKey(["shop", "public", "my_table"])
    assert upstream_key(cfg, "customers_clean") == feed_key("customers_clean") == AssetKey(["feeds", "customers_clean"])
    assert upstream_key(cfg, "crm.sales.accounts") == AssetKey(["crm", "sales", "accounts"])
    assert warehouse_key("customers") == AssetKey(["warehouse", "customers"])
