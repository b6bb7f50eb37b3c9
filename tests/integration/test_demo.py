"""``headwater demo`` runs end to end (small workload) and can run twice."""

from __future__ import annotations

import subprocess
import sys

import orjson


def run(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "headwater", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def test_demo_runs_twice_and_captures_the_workload(tmp_path):
    for _ in range(2):
        result = run("demo", "--small", "demo", cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
    assert "captured until caught up" in result.stdout
    topics = run("--config", "demo/headwater.yaml", "log", "topics", "--json", cwd=tmp_path)
    assert topics.returncode == 0, topics.stderr
    records = {t["topic"]: t["records"] for t in orjson.loads(topics.stdout)}
    # 300 seeded + 3000 bulk customers, plus updates; orders and items streamed.
    assert records["shop.public.customers"] > 3300
    assert records["shop.public.orders"] >= 600
    assert records["shop.public.order_items"] >= 1800
    tail = run(
        "--config",
        "demo/headwater.yaml",
        "log",
        "tail",
        "shop.public.customers",
        "--from-beginning",
        "--json",
        cwd=tmp_path,
    )
    events = [orjson.loads(line) for line in tail.stdout.splitlines()]
    with_points = [e for e in events if e["value"] and "loyalty_points" in (e["value"]["after"] or {})]
    assert with_points, "the schema change (customers.loyalty_points) must reach the log"
    # The generated password lives only in the environment: the config holds the reference.
    config_text = (tmp_path / "demo" / "headwater.yaml").read_text()
    assert "postgresql://capture:${HEADWATER_DEMO_PASSWORD}@127.0.0.1:" in config_text


def test_status_after_demo_reports_unreachable_source_without_failing(tmp_path):
    assert run("demo", "--small", "demo", cwd=tmp_path).returncode == 0
    # The demo stopped its Postgres: status still answers, with the reason per source.
    result = subprocess.run(
        [sys.executable, "-m", "headwater", "--config", "demo/headwater.yaml", "status", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "HEADWATER_DEMO_PASSWORD": "not-the-password"},
    )
    assert result.returncode == 0, result.stderr
    status = orjson.loads(result.stdout)
    assert "cannot reach PostgreSQL" in status["sources"][0]["error"]
    assert "not-the-password" not in result.stdout + result.stderr
    assert {t["topic"] for t in status["topics"]} >= {"shop.public.customers", "_headwater.schemas"}
