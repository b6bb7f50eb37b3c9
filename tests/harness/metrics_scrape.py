"""Reading ``/metrics`` as Prometheus would: a real HTTP GET, samples by name and labels."""

from __future__ import annotations

import re
import socket
import urllib.request

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    """``name{labels sorted by name}`` -> value of every sample on ``/metrics`` (a real HTTP GET)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if found := SAMPLE.match(line):
            labels = sorted(re.findall(r'[a-zA-Z_]+="[^"]*"', found.group(2) or ""))
            samples[found.group(1) + ("{" + ",".join(labels) + "}" if labels else "")] = float(found.group(3))
    return samples


def total(samples: dict[str, float], prefix: str) -> float:
    return sum(value for key, value in samples.items() if key.startswith(prefix))
