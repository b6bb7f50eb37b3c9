"""``headwater ui`` in a real headless Chromium: the asset graph, check results and the quality report render.

Needs the Debian package ``chromium`` (``/usr/bin/chromium``); skipped without it. No
Playwright/WebDriver: ``chromium --headless --dump-dom`` gives the DOM after the page's
scripts ran (kept in the test's tmp dir); ``--screenshot`` an image of a page whose checks
failed (only then: each Chromium run costs seconds).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from harness.browser import CHROMIUM, chromium, graphql, screenshot_on_failure, wait_ready

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs headless Chromium: apt-get install chromium (Debian package 'chromium')"
)

CONFIG = """\
project: shop
sources:
  shop:
    dsn: postgresql://capture:${HW_UI_TEST_UNSET_PASSWORD}@127.0.0.1:1/shop
    tables: [public.orders, public.customers]
feeds:
  customers_clean:
    from: shop.public.customers
    sql: SELECT id, lower(email) AS email FROM source
    key: [id]
warehouse:
  tables:
    orders: {from: shop.public.orders, mode: scd1}
    customers_hist: {from: shop.public.customers, mode: scd2}
quality:
  orders:
    - {expect: expect_column_values_to_be_unique, column: id, blocking: true}
    - {expect: expect_column_values_to_be_between, column: total, min_value: 0}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_quality_checks(base: str, timeout_s: float = 180) -> str:
    launched = graphql(
        base,
        'mutation { launchRun(executionParams: {selector: {repositoryLocationName: "shop", '
        'repositoryName: "__repository__", jobName: "quality_checks"}, runConfigData: "{}"}) '
        "{ __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }",
    )["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = graphql(base, f'{{ runOrError(runId: "{run_id}") {{ ... on Run {{ status }} }} }}')["runOrError"]
        if status["status"] in {"SUCCESS", "FAILURE", "CANCELED"}:
            return status["status"]
        time.sleep(1)
    raise AssertionError("the quality_checks run did not finish")


def test_ui_shows_assets_and_check_results_and_the_report_renders(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "headwater.yaml").write_text(CONFIG)
    write_deltalake(
        str(project / ".headwater" / "warehouse" / "orders"),
        pa.table({"id": [1, 2, 2, 3], "total": [10.0, -4.5, 3.0, 8.0]}),
    )
    shots = tmp_path / "screenshots"
    shots.mkdir()
    env = {**os.environ, "HEADWATER_CONFIG": str(project / "headwater.yaml")}
    env.pop("HW_UI_TEST_UNSET_PASSWORD", None)

    report = tmp_path / "report.html"
    quality = subprocess.run(
        [sys.executable, "-m", "headwater", "quality", "--report", str(report)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # the blocking uniqueness check fails; customers_hist is not loaded yet, so its built-in
    # SCD2 invariants (blocking) count as failed with that reason
    assert quality.returncode == 1, quality.stdout + quality.stderr
    assert "4 blocking expectations failed: orders.expect_column_values_to_be_unique__id, customers_hist.scd2_" in (
        quality.stderr
    )
    rendered = chromium(report.as_uri(), shots, "quality_report")
    with screenshot_on_failure(report.as_uri(), shots, "quality_report"):
        assert "Data quality: shop" in rendered
        assert "expect_column_values_to_be_between" in rendered and "-4.5" in rendered
        assert "<svg" in rendered

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "ui.log"
    with log.open("wb") as out:
        ui = subprocess.Popen(
            [sys.executable, "-m", "headwater", "ui", "--port", str(port)],
            cwd=project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(base, ui, log)
        assert graphql(base, "mutation { setNuxSeen }")["setNuxSeen"] is True
        assert launch_quality_checks(base) == "FAILURE"  # a blocking check failed

        url = f"{base}/locations/shop/asset-groups/warehouse"
        graph = chromium(url, shots, "asset_graph")
        with screenshot_on_failure(url, shots, "asset_graph"):
            for name in ("orders", "customers_hist"):
                assert name in graph, f"{name} not rendered in the asset graph"
        url = f"{base}/assets/warehouse/orders?view=checks"
        checks = chromium(url, shots, "orders_checks")
        with screenshot_on_failure(url, shots, "orders_checks"):
            assert "expect_column_values_to_be_between__total" in checks
            assert "Failed" in checks
        url = f"{base}/asset-groups"
        lineage = chromium(url, shots, "lineage")
        with screenshot_on_failure(url, shots, "lineage"):
            assert "sources" in lineage and "warehouse" in lineage
    finally:
        started = time.monotonic()
        ui.send_signal(signal.SIGTERM)
        try:
            code = ui.wait(timeout=30)
        except subprocess.TimeoutExpired:
            ui.kill()
            raise
        stop_s = time.monotonic() - started
    assert code == 0, log.read_text()[-2000:]
    assert stop_s < 15, f"stopping took {stop_s:.1f} s"
    assert "stopped the Dagster webserver and daemon" in log.read_text()
    assert (project / ".headwater" / "dagster" / "dagster.yaml").exists()
