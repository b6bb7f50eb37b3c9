"""A captured source delivered by a sink, and what the tests compare: per-key order and final state.

:class:`SinkPipeline` writes a ``headwater.yaml`` with one source (the audited table ``t`` of
:mod:`harness.audit`, whose trigger records every change in commit order) and one sink, and
runs the real CLI (``run --until-caught-up``, ``capture --follow``, ``sinks run --follow``).

:func:`check_delivery` compares what a target received with the audit: per key, the
delivered changes with repeats removed (by event id, first occurrence kept) equal the source's
changes in order, and the last one is the source's final row; repeats are counted so a test can
state how many its kind allows.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psycopg

from harness.audit import SCHEMA, audited_changes, run_batch
from harness.processes import die_with_parent, stop_at_exit

REPO = Path(__file__).resolve().parents[2]

#: One delivered event: its idempotency id, the source row's id, op and value (None for a delete).
Delivered = tuple[str, int, str, "int | None"]


@dataclass
class SinkPipeline:
    """A project directory with a source on ``dsn`` (table ``t`` audited) and sinks as given."""

    dir: Path
    dsn: str
    name: str
    sinks: dict[str, Any] = field(default_factory=dict)
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def config(self) -> Path:
        return self.dir / "headwater.yaml"

    @property
    def topic(self) -> str:
        return f"{self.name}.public.t"

    def setup(self, extra_tables: str = "", tables: tuple[str, ...] = ("public.t",)) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            if extra_tables:
                conn.execute(extra_tables)
            conn.execute(f"CREATE PUBLICATION headwater_{self.name} FOR TABLE {', '.join(tables)}")
        self.write(tables)

    def write(self, tables: tuple[str, ...] = ("public.t",)) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        body = {
            "project": "sinks",
            "home": str(self.dir / "home"),
            "log": {"backend": "file", "partitions": 3},
            "sources": {self.name: {"dsn": self.dsn, "tables": list(tables), "heartbeat_interval_s": 1}},
            "sinks": self.sinks,
        }
        self.config.write_text(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "headwater", "--config", str(self.config), *args]

    def cli(self, *args: str, timeout_s: float = 180, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        result = subprocess.run(self.command(*args), env=env, capture_output=True, text=True, timeout=timeout_s)
        if check and result.returncode != 0:
            raise AssertionError(f"headwater {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}")
        return result

    def start(self, *args: str) -> subprocess.Popen[str]:
        """A long-running CLI command in its own process group (killed at the end at the latest)."""
        log = (self.dir / f"{args[0]}-{len(self.processes)}.log").open("w")
        process = subprocess.Popen(
            self.command(*args),
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        self.processes.append(process)
        stop_at_exit(lambda: kill_group(process))
        return process

    def batches(self, first: int, count: int, rows: int = 20) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for batch in range(first, first + count):
                run_batch(conn, batch, rows)

    def close(self) -> None:
        for process in self.processes:
            kill_group(process)


def kill_group(process: subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(30)


def event_of(value: dict[str, Any]) -> tuple[int, str, int | None]:
    """``(id, op, v)`` of a Debezium event of ``t``."""
    row = value["after"] or value["before"]
    return row["id"], value["op"], (value["after"] or {}).get("v")


@dataclass
class DeliveryReport:
    delivered: int
    distinct: int
    repeats: int
    keys: int


def check_delivery(dsn: str, delivered: list[Delivered]) -> DeliveryReport:
    """Assert per-key order and completeness against the audit (repeats allowed, counted)."""
    truth: dict[int, list[tuple[str, int | None]]] = {}
    for op, row_id, v in audited_changes(dsn):
        truth.setdefault(row_id, []).append((op, v))
    seen: set[str] = set()
    got: dict[int, list[tuple[str, int | None]]] = {}
    for event_id, row_id, op, v in delivered:
        if event_id in seen:
            continue
        seen.add(event_id)
        got.setdefault(row_id, []).append(("c" if op == "r" else op, v))
    missing = [k for k in truth if k not in got]
    assert not missing, f"{len(missing)} keys never delivered, e.g. {missing[:5]}"
    for key, changes in truth.items():
        assert got[key] == changes, f"key {key}: delivered {got[key]} but the source changed it {changes}"
    assert set(got) == set(truth), f"delivered keys the source never had: {sorted(set(got) - set(truth))[:5]}"
    return DeliveryReport(len(delivered), len(seen), len(delivered) - len(seen), len(truth))


def final_rows(dsn: str) -> dict[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return dict(conn.execute("SELECT id, v FROM t").fetchall())
