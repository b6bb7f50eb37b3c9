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


def test_a_sink_is_an_asset_downstream_of_the_topics_its_globs_match(tmp_path):
    from dagster_project.assets import build_assets
    from dagster_project.lineage import sink_key, sink_upstream_keys

    raw = config(tmp_path).model_dump(by_alias=True, exclude={"config_path"})
    raw["sinks"] = {
        "cache": {"kind": "redis", "from": ["shop.public.*", "vip"]},
        "hook": {"kind": "webhook", "from": "crm.sales.accounts", "options": {"url": "http://h/x"}},
    }
    raw["sources"]["shop"]["dsn"] = "postgresql://u@h/db"
    raw["sources"]["crm"]["dsn"] = "postgresql://u@h/crm"
    cfg = parse_config(raw, tmp_path / "headwater.yaml")
    assert sink_upstream_keys(cfg, "cache") == [
        AssetKey(["shop", "public", "customers"]),
        AssetKey(["shop", "public", "orders"]),
        feed_key("vip"),
    ]
    assert sink_upstream_keys(cfg, "hook") == [AssetKey(["crm", "sales", "accounts"])]
    assets = {key: a for a in build_assets(cfg) for key in getattr(a, "keys", ())}
    assert sink_key("cache") in assets and sink_key("hook") in assets
    cache = assets[sink_key("cache")]
    assert set(cache.asset_deps[sink_key("cache")]) == set(sink_upstream_keys(cfg, "cache"))
