"""Queries stopped together by one schema change start again one at a time (issue 32's CI failure).

A query over the ``headwater_log`` source starts a Python process (Spark's streaming source
runner) that must connect back to the JVM within 10 s, a limit Spark hard-codes. The first
start of a command's queries already went one at a time; the restart after a schema change
did not: DDL on many tables stopped every query reading them at once, all were started again
together, and on CI's busy two cores one runner missed the 10 s ("Python worker failed to
connect back"): ``load`` stopped and ``run`` left it stopped (the DDL matrix, 29 loads).

Here each runner takes 2 s to start (a wrapper Python sleeps first), three tables (six loads)
get a column in DDL while ``load --follow`` runs, and every runner start, first or restart,
must come at least 2 s after the one before, and the tables end exact.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness.ddl_matrix import DdlCase, DdlProject

pytestmark = pytest.mark.integration

STARTUP_S = 2.0

SLOW_RUNNER = """#!/bin/sh
# Spark's Python workers start through this: its streaming source runner sleeps {delay} s first.
case " $* " in
  *" pyspark.sql.streaming.python_streaming_source_runner "*)
    date +%s.%N >> {starts}
    sleep {delay} ;;
esac
exec {python} "$@"
"""


def test_queries_a_schema_change_stopped_start_again_one_at_a_time(pg_database, unique_name, tmp_path: Path) -> None:
    cases = [DdlCase(name, {1: "ADD COLUMN tag text DEFAULT 'x'"}, frozenset({1})) for name in ("ra", "rb", "rc")]
    project = DdlProject(pg_database, unique_name("rst"), tmp_path, cases, rows=20)
    starts, python = tmp_path / "runner-starts", tmp_path / "slow-python"
    python.write_text(SLOW_RUNNER.format(starts=starts, delay=STARTUP_S, python=sys.executable))
    python.chmod(0o755)
    out = (tmp_path / "load.log").open("ab")
    load = None
    try:
        project.cli("capture", "--until-caught-up")
        load = subprocess.Popen(
            [sys.executable, "-m", "headwater", "--config", str(project.config_path), "load", "--follow"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYSPARK_PYTHON": str(python)},
        )
        problems = project.wait_equal(timeout_s=240)
        assert not problems, problems
        first = len(starts.read_text().split())
        assert first == 2 * len(cases), starts.read_text()
        project.apply(1)  # every table's schema changes: all six queries stop at their next batch
        for case in cases:
            for _ in range(5):
                project.touch(case)
        project.cli("capture", "--until-caught-up")
        problems = project.wait_equal(timeout_s=300)
        assert load.poll() is None, (tmp_path / "load.log").read_text()[-3000:]
    finally:
        if load is not None:
            load.send_signal(signal.SIGINT)
            load.wait(timeout=120)
        out.close()
        project.close()
    assert not problems, problems
    times = [float(line) for line in starts.read_text().split()]
    assert len(times) == 4 * len(cases), f"{len(times)} runner starts, wanted each query's first and its restart"
    gaps = [round(later - earlier, 2) for earlier, later in itertools.pairwise(times)]
    assert min(gaps) >= STARTUP_S, f"runners started together: gaps {gaps} s"
    assert "Python worker failed" not in (tmp_path / "load.log").read_text()
