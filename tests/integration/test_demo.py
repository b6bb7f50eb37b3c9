"""``headwater demo`` runs the whole pipeline end to end (small workload), again over a previous run's directory.

The previous run is interrupted with Ctrl-C once its embedded Postgres holds the seeded rows:
it leaves what a run leaves in the directory (Postgres data dir, ``headwater.yaml``, state dir)
and shows that Ctrl-C stops that Postgres. The second, full run must wipe the directory and
start from scratch. (Two full runs took ~120 s of CI time and proved the same: the demo
wipes the whole directory before anything else, so what the first run left in it does not
change the path the second run takes.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import orjson


def run(*args, cwd, env=None):
    return subprocess.run(
        [sys.executable, "-m", "headwater", *args], cwd=cwd, capture_output=True, text=True, timeout=900, env=env
    )


def interrupted_demo(cwd) -> tuple[int, str]:
    """``headwater demo --small demo`` stopped with SIGINT (Ctrl-C) after it seeded its Postgres.

    Returns the exit code and the output. Should the signal land once capture runs (which
    finishes its batch on SIGINT and returns), the demo goes on and completes: exit 0.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "headwater", "demo", "--small", "demo"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "seeded" in line:
                process.send_signal(signal.SIGINT)
                break
        rest, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, "".join(lines) + rest


def test_demo_runs_the_pipeline_again_and_leaves_a_queryable_warehouse(tmp_path):
    code, output = interrupted_demo(tmp_path)
    # Ctrl-C: one line ("aborted", exit 1), no traceback; exit 0 if the demo went on (see above).
    assert code == 0 or output.strip().splitlines()[-1] in ("aborted", "interrupted"), output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert (tmp_path / "demo" / "postgres" / "PG_VERSION").is_file(), output[-3000:]
    assert not (tmp_path / "demo" / "postgres" / "postmaster.pid").exists(), f"Postgres still runs:\n{output[-3000:]}"
    result = run("demo", "--small", "demo", cwd=tmp_path)  # wipes what the first run left, starts afresh
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


def test_the_mysql_demo_captures_an_embedded_mariadb_through_the_same_pipeline(tmp_path):
    result = run("demo", "--kind", "mysql", "--small", "demo", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "starting embedded MariaDB (binlog_format=ROW)" in out
    assert "feeds: orders_enriched caught up" in out
    assert "warehouse: customers, orders, orders_hist loaded" in out
    assert "quality: pass rate 100%" in out
    assert "done. MariaDB was stopped" in out and "log tail shop.shop.orders --limit 5 --json" in out
    config = "demo/headwater.yaml"
    assert "mysql://capture:${HEADWATER_DEMO_PASSWORD}@127.0.0.1:" in (tmp_path / config).read_text()

    def query(sql: str) -> list[dict]:
        answer = run("--config", config, "query", sql, "--format", "json", cwd=tmp_path)
        assert answer.returncode == 0, answer.stderr
        return orjson.loads(answer.stdout)

    # The same workload as PostgreSQL's, so the same warehouse (see the test above).
    assert query("SELECT count(*) AS n, count(*) FILTER (WHERE loyalty_points > 0) AS p FROM customers") == [
        {"n": 3300, "p": 100}
    ]
    assert query("SELECT count(*) AS n, count(country) AS c FROM orders") == [{"n": 588, "c": 588}]
    assert query(
        "SELECT count(*) AS versions, count(*) FILTER (WHERE __END_AT IS NULL) AS current FROM orders_hist"
    ) == [{"versions": 960, "current": 588}]
    # The deleted orders' items are deleted in the log too (each with its tombstone).
    tail = run("--config", config, "log", "tail", "shop.shop.order_items", "--from-beginning", "--json", cwd=tmp_path)
    ops = [(orjson.loads(line)["value"] or {"op": "tombstone"})["op"] for line in tail.stdout.splitlines()]
    assert ops.count("c") == 1800 and ops.count("d") == ops.count("tombstone") == 36

    env = {**os.environ, "HEADWATER_DEMO_PASSWORD": "x"}
    status = run("--config", config, "status", "--json", cwd=tmp_path, env=env)
    assert status.returncode == 0, status.stderr
    (source,) = orjson.loads(status.stdout)["sources"]
    assert source["kind"] == "mysql" and source["position"].startswith("binlog.") and "error" in source
