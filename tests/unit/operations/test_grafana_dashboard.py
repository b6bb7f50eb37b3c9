"""docs/grafana-dashboard.json asks only for metrics Headwater exposes (names drift otherwise)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

import core.metrics  # noqa: F401  (registers the stage counters and histograms)
import operations.pipeline_metrics as pipeline_metrics

REPO = Path(__file__).resolve().parents[3]


def exposed() -> set[str]:
    """Every sample name ``/metrics`` can show: registered families and the collector's own."""
    names = set()
    for family in REGISTRY.collect():
        if family.name.startswith("headwater_"):
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}.get(family.type, ("",))
            names.update(family.name + suffix for suffix in suffixes)
    source = Path(pipeline_metrics.__file__).read_text()
    for kind, name in re.findall(r'(Gauge|Counter)MetricFamily\(\s*"(headwater_\w+)"', source):
        names.add(name + ("_total" if kind == "Counter" else ""))
    return names


def test_every_metric_the_dashboard_queries_is_exposed():
    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"headwater_\w+", target["expr"])
    }
    available = exposed()
    assert len(queried) >= 15
    assert queried <= available, f"not exposed: {sorted(queried - available)}"
    assert "headwater_capture_events_total" in available and "headwater_cleaner_passes_total" in available
