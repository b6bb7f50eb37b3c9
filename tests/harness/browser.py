"""A real headless Chromium and the Dagster webserver's GraphQL, for UI tests.

No Playwright/WebDriver: ``chromium --headless --dump-dom`` gives the DOM after the page's
scripts ran (kept in the test's tmp dir); ``--screenshot`` an image of a page whose checks
failed (only then: each Chromium run costs seconds). Needs the Debian package ``chromium``.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")


def graphql(base: str, query: str) -> dict:
    request = urllib.request.Request(
        f"{base}/graphql", data=json.dumps({"query": query}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["data"]


def chromium_flags(shots: Path) -> list[str]:
    return [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={shots / 'chromium-profile'}",
        "--window-size=1600,1000",
        "--virtual-time-budget=20000",
    ]


def chromium(url: str, shots: Path, name: str) -> str:
    """The page's DOM after its scripts ran (kept as ``<name>.html``; a failing test adds a screenshot)."""
    dom = subprocess.run([*chromium_flags(shots), "--dump-dom", url], capture_output=True, text=True, timeout=120)
    (shots / f"{name}.html").write_text(dom.stdout)
    return dom.stdout


@contextlib.contextmanager
def screenshot_on_failure(url: str, shots: Path, name: str) -> Iterator[None]:
    """Screenshot ``url`` only when the block's assertions fail: each Chromium run costs seconds."""
    try:
        yield
    except AssertionError:
        shot = [*chromium_flags(shots), f"--screenshot={shots / (name + '.png')}", url]
        subprocess.run(shot, capture_output=True, timeout=120)
        raise


def wait_ready(base: str, process: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"headwater ui exited: {log.read_text()[-2000:]}"
        try:
            with urllib.request.urlopen(f"{base}/server_info", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the UI did not come up: {log.read_text()[-2000:]}")
