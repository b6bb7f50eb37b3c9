"""The HTML quality report: self-contained, complete, with the pass-rate chart from run history."""

from __future__ import annotations

import re

import orjson

from core.config import parse_config
from log.base import Record, TopicSpec
from log.file.backend import FileLog
from warehouse_loader.quality import load_runs
from warehouse_loader.quality_report import pass_rate_chart, pass_rate_series, quarantine_counts, render_report


def run_json(run_at: str, customers_rate: float, orders_rate: float | None = 1.0) -> dict:
    tables = {
        "customers": {
            "rows": 1200,
            "passed": 1,
            "evaluated": 2,
            "pass_rate": customers_rate,
            "error": None,
            "expectations": [
                {
                    "name": "expect_column_values_to_be_unique__id",
                    "expect": "expect_column_values_to_be_unique",
                    "kwargs": {"column": "id"},
                    "blocking": True,
                    "success": True,
                    "unexpected_count": 0,
                    "unexpected_percent": 0.0,
                    "samples": [],
                },
                {
                    "name": "expect_column_values_to_be_between__balance",
                    "expect": "expect_column_values_to_be_between",
                    "kwargs": {"column": "balance", "min_value": 0},
                    "blocking": False,
                    "success": False,
                    "unexpected_count": 7,
                    "unexpected_percent": 0.58,
                    "samples": [-5.25, "<script>x</script>"],
                },
            ],
        }
    }
    if orders_rate is not None:
        tables["orders"] = {"rows": None, "passed": 0, "evaluated": 1, "pass_rate": orders_rate, "expectations": []}
    return {"run_at": run_at, "pass_rate": customers_rate, "failed_blocking": [], "tables": tables}


def test_report_is_self_contained_and_shows_tables_results_and_quarantine(tmp_path):
    history = [run_json(f"2026-01-0{i}T00:00:00+00:00", i / 5) for i in range(1, 5)]
    html = render_report(
        "shop",
        history[-1],
        history,
        {"customers_clean.quarantine": 3, "orders_clean.quarantine": 0},
        data_docs=tmp_path / "data_docs",
    )
    lowered = html.lower()
    assert "http://" not in lowered and "https://" not in lowered and "//cdn" not in lowered
    assert "<link" not in lowered and "<script" not in lowered and "@import" not in lowered and "url(" not in lowered
    assert "<style>" in html and "<svg" in html
    for text in ("customers", "orders", "expect_column_values_to_be_between", "7 (0.58%)", "-5.25", "blocking"):
        assert text in html
    assert "&lt;script&gt;x&lt;/script&gt;" in html  # sample values are escaped, never markup
    assert "customers_clean.quarantine" in html and ">3<" in html
    assert "render unstyled offline" in html


def test_chart_has_a_series_per_table_and_overall_from_a_runs_file(tmp_path):
    path = tmp_path / "runs.jsonl"
    runs = [run_json("2026-01-01T00:00:00+00:00", 0.5, None), run_json("2026-01-02T00:00:00+00:00", 1.0, 0.0)]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in runs))
    history = load_runs(path)
    series = pass_rate_series(history)
    assert series == {"all tables": [(0, 0.5), (1, 1.0)], "customers": [(0, 0.5), (1, 1.0)], "orders": [(1, 0.0)]}
    svg = pass_rate_chart(history)
    assert re.findall(r'data-series="([^"]+)"', svg) == ["all tables", "customers", "orders"]
    assert svg.count("<circle") == 5
    assert "2026-01-01 00:00" in svg and "2026-01-02 00:00" in svg
    assert "No recorded runs" in pass_rate_chart([])


def test_quarantine_counts_feed_topics_even_when_absent(tmp_path):
    config = parse_config(
        {
            "project": "p",
            "feeds": {"clean": {"from": "s.public.t", "sql": "SELECT * FROM source", "key": ["id"]}},
        },
        tmp_path / "headwater.yaml",
    )
    log = FileLog(tmp_path / "log")
    try:
        log.create_topic(TopicSpec("s.public.t.quarantine", partitions=2, compacted=False))
        log.append("s.public.t.quarantine", 0, [Record(key=b"1", value=b"{}"), Record(key=b"2", value=b"{}")])
        log.append("s.public.t.quarantine", 1, [Record(key=b"3", value=b"{}")])
        assert quarantine_counts(config, log) == {"clean.quarantine": 0, "s.public.t.quarantine": 3}
    finally:
        log.close()
