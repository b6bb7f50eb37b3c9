"""The quality report: ONE self-contained HTML file (inline CSS, inline SVG, no external URL).

It must render the same offline, from a mail attachment or a CI artefact, so nothing is
loaded from anywhere: no CDN, no web font, no script. GX Data Docs, built beside it, are
the opposite (they load CSS/JS from CDNs and render unstyled offline); the report says so.

Everything here is pure (dicts in, text out) except :func:`quarantine_counts`, which
reads end offsets from the log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from pathlib import Path
from typing import Any

import orjson

from core.config import ProjectConfig
from core.durable_files import replace_file
from log.base import Log
from log.topics import is_quarantine_topic, quarantine_topic
from warehouse_loader.quality import (
    QualityRun,
    data_docs_path,
    latest_verifications,
    load_runs,
    quality_dir,
    run_quality,
    runs_path,
)

_PALETTE = ("#1f6feb", "#d4731a", "#2da44e", "#8250df", "#cf222e", "#0f8f8f", "#9a6700", "#6e7781")
_WIDTH, _HEIGHT = 720, 240
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 150, 16, 36

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1100px;
color:#1f2328;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;
padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
.muted{color:#656d76}.summary{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0}
.card{border:1px solid #d0d7de;border-radius:6px;padding:8px 14px;min-width:120px}
.card b{display:block;font-size:20px}
table{border-collapse:collapse;width:100%;margin:6px 0 12px}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace}
.pass{color:#1a7f37;font-weight:600}.fail{color:#cf222e;font-weight:600}.warn{color:#9a6700;font-weight:600}
.tag{font-size:11px;border:1px solid #cf222e;color:#cf222e;border-radius:10px;padding:0 6px;margin-left:4px}
.note{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:8px 12px}
svg text{font:11px system-ui,sans-serif;fill:#1f2328}
"""


def quarantine_counts(config: ProjectConfig, log: Log) -> dict[str, int]:
    """Records in every ``<feed>.quarantine`` topic (0 when it does not exist) and any other quarantine topic."""
    topics = set(log.list_topics())
    counts: dict[str, int] = {}
    names = [quarantine_topic(feed) for feed in config.feeds]
    names += sorted(t for t in topics if is_quarantine_topic(t) and t not in names)
    for topic in names:
        if topic not in topics:
            counts[topic] = 0
            continue
        partitions = log.describe_topic(topic).partitions
        counts[topic] = sum(log.end_offset(topic, p) - log.beginning_offset(topic, p) for p in range(partitions))
    return counts


def _percent(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}%"


def _x(index: int, count: int) -> float:
    span = _WIDTH - _LEFT - _RIGHT
    return _LEFT + (span * index / (count - 1) if count > 1 else span / 2)


def _y(rate: float) -> float:
    return _TOP + (_HEIGHT - _TOP - _BOTTOM) * (1 - rate)


def pass_rate_series(runs: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """``{"all tables": [(run index, rate)...], "<table>": [...]}`` from recorded runs (oldest first)."""
    series: dict[str, list[tuple[int, float]]] = {"all tables": []}
    for index, run in enumerate(runs):
        if run.get("pass_rate") is not None:
            series["all tables"].append((index, float(run["pass_rate"])))
        for table, result in sorted((run.get("tables") or {}).items()):
            if result.get("pass_rate") is not None:
                series.setdefault(table, []).append((index, float(result["pass_rate"])))
    return series


def _short_time(text: str | None) -> str:
    if not text:
        return ""
    try:
        return datetime.fromisoformat(text).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return text


def pass_rate_chart(runs: Sequence[Mapping[str, Any]]) -> str:
    """An inline SVG line chart of pass rate per run (overall and per table), or a note when there is no run."""
    if not runs:
        return '<p class="muted">No recorded runs yet.</p>'
    count = len(runs)
    parts = [
        f'<svg role="img" aria-label="pass rate over the last {count} runs" '
        f'width="{_WIDTH}" height="{_HEIGHT}" viewBox="0 0 {_WIDTH} {_HEIGHT}">'
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = _y(tick)
        parts.append(f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_WIDTH - _RIGHT}" y2="{y:.1f}" stroke="#d0d7de"/>')
        parts.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{tick * 100:.0f}%</text>')
    first, last = _short_time(runs[0].get("run_at")), _short_time(runs[-1].get("run_at"))
    parts.append(f'<text x="{_LEFT}" y="{_HEIGHT - 12}">{escape(first)}</text>')
    if count > 1:
        parts.append(f'<text x="{_WIDTH - _RIGHT}" y="{_HEIGHT - 12}" text-anchor="end">{escape(last)}</text>')
    for number, (name, points) in enumerate(pass_rate_series(runs).items()):
        if not points:
            continue
        color = _PALETTE[number % len(_PALETTE)]
        width = 3 if number == 0 else 1.5
        coords = " ".join(f"{_x(i, count):.1f},{_y(rate):.1f}" for i, rate in points)
        parts.append(
            f'<polyline class="series" data-series="{escape(name)}" fill="none" stroke="{color}" '
            f'stroke-width="{width}" points="{coords}"/>'
        )
        for i, rate in points:
            parts.append(
                f'<circle cx="{_x(i, count):.1f}" cy="{_y(rate):.1f}" r="2.5" fill="{color}">'
                f"<title>{escape(name)}: {rate * 100:.1f}%</title></circle>"
            )
        legend_y = _TOP + 14 * number + 6
        parts.append(
            f'<rect x="{_WIDTH - _RIGHT + 12}" y="{legend_y - 8}" width="10" height="10" fill="{color}"/>'
            f'<text x="{_WIDTH - _RIGHT + 26}" y="{legend_y + 1}">{escape(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _value(value: Any) -> str:
    return escape(orjson.dumps(value).decode()) if not isinstance(value, str) else escape(value)


def _arguments(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{escape(str(k))}={_value(v)}" for k, v in kwargs.items())


def _table_section(table: str, result: Mapping[str, Any]) -> str:
    rate = result.get("pass_rate")
    rows = result.get("rows")
    head = (
        f'<h3 id="table-{escape(table)}">{escape(table)} '
        f'<span class="muted">{_percent(rate)} passed ({result.get("passed", 0)}/{result.get("evaluated", 0)}), '
        f"{'-' if rows is None else f'{rows:,}'} rows</span></h3>"
    )
    error = f'<p class="fail">{escape(str(result["error"]))}</p>' if result.get("error") else ""
    lines = [
        "<table><tr><th>expectation</th><th>arguments</th><th>result</th>"
        "<th>unexpected</th><th>sample unexpected values</th></tr>"
    ]
    for item in result.get("expectations") or []:
        ok = bool(item.get("success"))
        blocking = '<span class="tag">blocking</span>' if item.get("blocking") else ""
        verdict = '<span class="pass">pass</span>' if ok else '<span class="fail">fail</span>'
        count = item.get("unexpected_count")
        unexpected = "-" if count is None else f"{count:,}"
        if item.get("unexpected_percent") is not None:
            unexpected += f" ({item['unexpected_percent']:.2f}%)"
        samples = ", ".join(_value(v) for v in item.get("samples") or [])
        if item.get("error"):
            samples = f'<span class="fail">{escape(str(item["error"]))}</span>'
        elif not samples and item.get("observed_value") is not None:
            samples = f'<span class="muted">observed {_value(item["observed_value"])}</span>'
        lines.append(
            f"<tr><td><code>{escape(str(item.get('expect')))}</code>{blocking}</td>"
            f"<td><code>{_arguments(item.get('kwargs') or {})}</code></td><td>{verdict}</td>"
            f"<td>{unexpected}</td><td><code>{samples}</code></td></tr>"
        )
    lines.append("</table>")
    return head + error + "".join(lines)


def render_report(
    project: str,
    run: Mapping[str, Any],
    history: Sequence[Mapping[str, Any]],
    quarantine: Mapping[str, int],
    *,
    data_docs: Path | None = None,
    verifications: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The whole report: summary, pass-rate chart over ``history``, per-table results, quarantine counts.

    ``run`` and ``history`` entries are :meth:`warehouse_loader.quality.QualityRun.as_json` objects.
    """
    tables: Mapping[str, Mapping[str, Any]] = run.get("tables") or {}
    failed_blocking: Sequence[str] = run.get("failed_blocking") or []
    verdict = (
        f'<span class="fail">{len(failed_blocking)} blocking expectation(s) failed</span>'
        if failed_blocking
        else '<span class="pass">no blocking expectation failed</span>'
    )
    cards = [
        ("pass rate", _percent(run.get("pass_rate"))),
        ("tables", str(len(tables))),
        ("expectations", str(sum(int(t.get("evaluated") or 0) for t in tables.values()))),
        ("quarantined records", f"{sum(quarantine.values()):,}"),
    ]
    body = [
        f"<h1>Data quality: {escape(project)}</h1>",
        f'<p class="muted">run at {escape(str(run.get("run_at", "")))} &middot; {verdict}</p>',
        '<div class="summary">'
        + "".join(f'<div class="card"><span class="muted">{k}</span><b>{escape(v)}</b></div>' for k, v in cards)
        + "</div>",
        f"<h2>Pass rate over the last {len(history)} run{'s' if len(history) != 1 else ''}</h2>",
        pass_rate_chart(history),
        "<h2>Tables</h2>",
        "<table><tr><th>table</th><th>rows</th><th>passed</th><th>pass rate</th><th>blocking failures</th></tr>",
    ]
    for table, result in tables.items():
        blocking_failed = sum(1 for e in result.get("expectations") or [] if e.get("blocking") and not e.get("success"))
        rows = result.get("rows")
        body.append(
            f'<tr><td><a href="#table-{escape(table)}">{escape(table)}</a></td>'
            f"<td>{'-' if rows is None else f'{rows:,}'}</td>"
            f"<td>{result.get('passed', 0)}/{result.get('evaluated', 0)}</td>"
            f"<td>{_percent(result.get('pass_rate'))}</td>"
            f'<td class="{"fail" if blocking_failed else "pass"}">{blocking_failed}</td></tr>'
        )
    body.append("</table>")
    body.extend(_table_section(table, result) for table, result in tables.items())
    if verifications:
        body.append(_verify_section(verifications))
    body.append("<h2>Quarantine</h2>")
    if quarantine:
        body.append("<table><tr><th>topic</th><th>records</th></tr>")
        body.extend(
            f'<tr><td><code>{escape(topic)}</code></td><td class="{"warn" if n else "pass"}">{n:,}</td></tr>'
            for topic, n in quarantine.items()
        )
        body.append("</table>")
    else:
        body.append('<p class="muted">No feeds and no quarantine topics: nothing quarantined.</p>')
    if data_docs is not None:
        body.append(
            "<h2>Great Expectations Data Docs</h2>"
            f'<p class="note">Built in <code>{escape(str(data_docs))}</code> (open <code>index.html</code>). '
            "They load their CSS and JavaScript from public CDNs, so they render unstyled offline; "
            "this report is self-contained.</p>"
        )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Headwater data quality: {escape(project)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )


def _verify_section(verifications: Mapping[str, Mapping[str, Any]]) -> str:
    """The last ``headwater verify`` of each table: when, at which LSN, equal or which keys differ."""
    lines = [
        "<h2>Verified against the source</h2>",
        "<table><tr><th>table</th><th>verified at</th><th>snapshot LSN</th><th>rows (source / warehouse)</th>"
        "<th>result</th><th>keys</th></tr>",
    ]
    for table, run in sorted(verifications.items()):
        count = int(run.get("differences") or 0)
        unsettled = run.get("unsettled") or []
        if run.get("equal"):
            verdict = '<span class="pass">equal</span>'
        else:
            verdict = f'<span class="fail">{count} key{"s" if count != 1 else ""} differ</span>'
            if unsettled:
                verdict += f' <span class="warn">{len(unsettled)} unsettled</span>'
        keys = ", ".join(escape(str(item.get("key"))) for item in (run.get("keys") or [])[:10])
        lines.append(
            f"<tr><td>{escape(table)}</td><td>{escape(_short_time(run.get('run_at')))}</td>"
            f"<td><code>{escape(str(run.get('lsn', '')))}</code></td>"
            f"<td>{run.get('source_rows', '-')} / {run.get('warehouse_rows', '-')}</td>"
            f"<td>{verdict}</td><td><code>{keys}</code></td></tr>"
        )
    lines.append("</table>")
    return "".join(lines)


def write_report(path: Path, html: str) -> Path:
    """Write the report atomically (a reader never sees half a file); return its path."""
    replace_file(path, html.encode(), mode=0o644, durable=False)
    return path


#: Runs shown in the report's pass-rate chart.
HISTORY_RUNS = 30


def run_and_report(
    config: ProjectConfig, log: Log, tables: Sequence[str] = (), report_path: Path | None = None
) -> tuple[QualityRun, Path]:
    """Run the suites (with GX Data Docs) and write the HTML report; return the run and the report's path."""
    run = run_quality(config, tables or None, data_docs=True)
    html = render_report(
        config.project,
        run.as_json(),
        load_runs(runs_path(config), limit=HISTORY_RUNS),
        quarantine_counts(config, log),
        data_docs=data_docs_path(config),
        verifications=latest_verifications(config),
    )
    return run, write_report(report_path or quality_dir(config) / "report.html", html)
