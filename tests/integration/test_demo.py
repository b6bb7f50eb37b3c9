"""``headwater demo`` runs the whole pipeline end to end (small workload), twice."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson


def run(*args, cwd, env=None):
    return subprocess.run(
        [sys.executable, "-m", "headwater", *args], cwd=cwd, capture_output=True, text=True, timeout=900, env=env
    )


def test_demo_runs_the_pipeline_twice_and_leaves_a_queryable_warehouse(tmp_path):
    for _ in range(2):  # running it twice works: each run starts from a clean directory
        result = run("demo", "--small", "demo", cwd=tmp_path)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "captured until caught up" in out
    assert "feeds: orders_enriched caught up" in out
    assert "warehouse: customers, orders, orders_hist loaded" in out
    assert "quality: pass rate 100%" in out
    config = "demo/headwater.yaml"

    # The warehouse equals what the workload did: 300 seeded + 3000 bulk customers;
    # 600 orders minus every 50th deleted (12), all with a customer and a country.
    query = run("--config", config, "query", "SELECT count(*) AS n FROM customers", "--format", "json", cwd=tmp_path)
    assert orjson.loads(query.stdout) == [{"n": 3300}]
    orders = run(
        "--config",
        config,
        "query",
        "SELECT count(*) AS n, count(country) AS c FROM orders",
        "--format",
        "json",
        cwd=tmp_path,
    )
    assert orjson.loads(orders.stdout) == [{"n": 588, "c": 588}]
    history = run(
        "--config",
        config,
        "query",
        "SELECT count(*) AS versions, count(*) FILTER (WHERE __END_AT IS NULL) AS current FROM orders_hist",
        "--format",
        "json",
        cwd=tmp_path,
    )
    # 600 inserts + 300 'paid' + 60 'shipped' updates; 12 deleted orders have no current version.
    assert orjson.loads(history.stdout) == [{"versions": 960, "current": 588}]
    points = run(
        "--config",
        config,
        "query",
        "SELECT count(*) AS n FROM customers WHERE loyalty_points > 0",
        "--format",
        "json",
        cwd=tmp_path,
    )
    assert orjson.loads(points.stdout)[0]["n"] > 0, "the schema change (customers.loyalty_points) reached the warehouse"
    report = tmp_path / "demo" / ".headwater" / "quality" / "report.html"
    assert report.is_file() and "customers" in report.read_text()

    # The generated password lives only in the environment: the config holds the reference.
    assert "postgresql://capture:${HEADWATER_DEMO_PASSWORD}@127.0.0.1:" in (tmp_path / config).read_text()

    # The demo stopped its Postgres: status still answers, with the reason per source.
    status = run(
        "--config",
        config,
        "status",
        "--json",
        cwd=tmp_path,
        env={**os.environ, "HEADWATER_DEMO_PASSWORD": "not-the-password"},
    )
    assert status.returncode == 0, status.stderr
    body = orjson.loads(status.stdout)
    assert "cannot reach PostgreSQL" in body["sources"][0]["error"]
    assert "not-the-password" not in status.stdout + status.stderr
    assert {t["table"] for t in body["tables"]} == {"customers", "orders", "orders_hist"}
    assert all(t["state"] == "loaded" and t["lag"] == 0 for t in body["tables"])
    assert [(f["feed"], f["lag"]) for f in body["feeds"]] == [("orders_enriched", 0)]
