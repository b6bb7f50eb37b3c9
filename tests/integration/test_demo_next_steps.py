"""What ``headwater demo`` suggests next works exactly as printed, and the UI shows every asset materialized.

One small demo run; then each ``try next:`` line is run by a shell as printed, from the
directory the demo ran in, without the demo's password variable (the demo does not keep
it): each must exit 0 with its output and no traceback. The ``ui`` line is started as
printed (port 3000; another ``--port`` only when 3000 is taken on this machine) and,
while it serves, the asset catalog is opened in a real headless Chromium: every asset is
listed and none is "Never materialized"; through the webserver's GraphQL every asset has a
materialization, and the SCD2 history's daily partitions start at the day of the data
(not years before).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import socket
import subprocess
import sys

import orjson
import pytest
from harness.browser import CHROMIUM, chromium, graphql, screenshot_on_failure, wait_ready

UI_PORT = 3000


def port_taken(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def next_steps(output: str) -> list[str]:
    lines = output.splitlines()
    start = lines.index("try next:") + 1
    return [line.strip() for line in lines[start:] if line.startswith("  ")]


def text_of(dom: str) -> str:
    """The page's text, one `` | `` between elements."""
    text = re.sub(r"<script.*?</script>|<style.*?</style>", "", dom, flags=re.S)
    return re.sub(r"(\s*\|\s*)+", " | ", re.sub(r"<[^>]+>", " | ", text))


def shell(line: str, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs headless Chromium: apt-get install chromium")
def test_every_next_step_the_demo_prints_works_as_printed_and_the_ui_shows_every_asset_materialized(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HEADWATER_DEMO_PASSWORD"}
    demo = subprocess.run(
        [sys.executable, "-m", "headwater", "demo", "--small", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert re.search(r"recorded \d+ asset materializations", demo.stdout), demo.stdout[-2000:]
    steps = next_steps(demo.stdout)
    # "<headwater> --config demo/headwater.yaml <command>   # comment": the command after the config
    commands = {step: step.split("#", 1)[0].split(" --config demo/headwater.yaml ", 1)[1].split() for step in steps}
    assert sorted(c[0] for c in commands.values()) == ["log", "log", "query", "status", "ui"], steps

    for step, command in commands.items():
        if command[0] == "ui":
            continue
        result = shell(step, tmp_path, env)
        assert result.returncode == 0, f"{step}\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
        assert "Traceback" not in result.stdout + result.stderr, step
        if command[0] == "query":
            # the first five customers, in order, as the demo inserted them
            emails = re.findall(r"customer\d+@example\.com", result.stdout)
            assert emails == [f"customer{i}@example.com" for i in range(1, 6)], result.stdout
            assert "(5 rows)" in result.stdout, result.stdout
        elif command[0] == "status":
            assert "orders_hist" in result.stdout and "shop.public.orders" in result.stdout, result.stdout
            assert "HEADWATER_DEMO_PASSWORD" in result.stdout  # why the source was not checked
        elif command[:2] == ["log", "topics"]:
            assert "shop.public.orders" in result.stdout
        elif command[:2] == ["log", "tail"]:
            records = [orjson.loads(line) for line in result.stdout.splitlines()]
            assert len(records) == 5 and all(r["topic"] == "shop.public.orders" for r in records), result.stdout

    [ui_step] = [step for step, command in commands.items() if command[0] == "ui"]
    port = UI_PORT
    if port_taken(UI_PORT):  # another program on this machine has it: the same command on a free port
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        ui_step = ui_step.replace(" ui ", f" ui --port {port} ", 1)
    log = tmp_path / "ui.log"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with log.open("wb") as out:
        ui = subprocess.Popen(
            ["bash", "-c", f"exec {ui_step}"], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, ui, log)
        nodes = graphql(
            base,
            "{ assetNodes { assetKey { path } isPartitioned partitionKeys "
            "assetMaterializations(limit: 1) { timestamp } partitionStats { numMaterialized numPartitions } } }",
        )["assetNodes"]
        names = ["/".join(n["assetKey"]["path"]) for n in nodes]
        # 3 captured tables, 1 feed, 3 warehouse tables
        assert len(nodes) == 7, names
        never = [name for name, n in zip(names, nodes, strict=True) if not n["assetMaterializations"]]
        assert not never, f"never materialized: {never}"
        today = dt.datetime.now(dt.UTC).date()
        partitioned = [n for n in nodes if n["isPartitioned"]]
        assert len(partitioned) == 1, names  # the SCD2 history, by commit day
        for node in partitioned:
            # the data's day (the demo ran today; a run across midnight may add one)
            assert 1 <= len(node["partitionKeys"]) <= 2, node["partitionKeys"][:5]
            assert (today - dt.date.fromisoformat(node["partitionKeys"][0])).days <= 1, node["partitionKeys"][:5]
            stats = node["partitionStats"]
            assert stats["numMaterialized"] == stats["numPartitions"], stats

        url = f"{base}/assets"
        catalog = chromium(url, shots, "asset_catalog")
        with screenshot_on_failure(url, shots, "asset_catalog"):
            for node in nodes:
                assert " / ".join(node["assetKey"]["path"]) in text_of(catalog), f"{node['assetKey']} not listed"
            assert "Never materialized" not in catalog
            assert text_of(catalog).count("Materialized") >= len(nodes) - len(partitioned)
    finally:
        ui.send_signal(signal.SIGTERM)
        try:
            code = ui.wait(timeout=30)
        except subprocess.TimeoutExpired:
            ui.kill()
            raise
    assert code == 0, log.read_text()[-2000:]
