"""The DDL matrix of issue 27: every schema change on its own table ends with SCD1, SCD2 and a feed equal to the source.

One project (``harness.ddl_matrix``): one source capturing schema ``ddl`` with ``schemas:``,
one table per DDL case, each loaded as SCD1 and SCD2, and a ``SELECT *`` feed over the table
whose column is renamed, loaded as SCD1. ``headwater run --follow`` streams while a writer
changes random rows of every table; each round applies every case's DDL:

* round 1 with the writer running (each DDL is followed by changes: pgoutput's Relation path);
* round 2 with the writer paused (no change follows: capture finds it in the catalog);
* rounds 3 and 4 with the pipeline (capture with it) stopped, round 3 followed by changes,
  round 4 not; ``run --follow`` started again after them.

After each round every table is compared with its source by canonical rows and checksum,
and SCD2's versions are counted against an audit trigger (one per insert or update, one more
per row whose value the DDL changed; a rename and a re-read that finds a row unchanged write
none). A reduced set (rounds 1 and 2) runs on the Kafka backend (tansu). One project and one
pipeline for all cases keep the wall time down (each table is a streaming query of the load).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from harness.ddl_matrix import DdlCase, DdlProject, Writer, default_cases

from warehouse_loader.formats import format_of
from warehouse_loader.load_job import table_path

TABLES = ("widen_numeric_scd1", "widen_numeric_scd2")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


def _report(title: str, problems: list[str], seconds: float) -> str:
    text = f"{title} ({seconds:.0f} s): " + ("all equal" if not problems else "\n  " + "\n  ".join(problems))
    print(text)
    return text


def _rounds_while_following(project: DdlProject, cases: list[DdlCase], reports: list[str]) -> list[str]:
    """Rounds 1 (a writer keeps changing rows after each DDL) and 2 (nothing follows the DDL); the problems."""
    # The snapshot first, with no writer: a change committed before the snapshot's point is never
    # streamed (the audit would count a version the snapshot cannot know of).
    started = time.monotonic()
    problems = project.wait_equal(timeout_s=600)
    reports.append(_report("snapshot", problems, time.monotonic() - started))
    if problems:
        return problems
    with Writer(project, cases) as writer:
        time.sleep(6)  # changes stream on top of the snapshot
        # Compared with the writer paused: with it running, every table changes several times a
        # second, so all of them are rarely equal at one instant on a loaded machine.
        writer.paused.set()
        started = time.monotonic()
        problems = project.wait_equal(timeout_s=420)
        reports.append(_report("streaming", problems, time.monotonic() - started))
        if problems:
            return problems
        writer.paused.clear()
        with writer.lock:
            project.apply(1)
        time.sleep(6)  # changes after every DDL: pgoutput's Relation path
        writer.paused.set()
        started = time.monotonic()
        problems = project.wait_equal(timeout_s=420)
        reports.append(_report("round 1, changes follow each DDL", problems, time.monotonic() - started))
        with writer.lock:
            project.apply(2)  # nothing follows: capture finds it in the catalog
        started = time.monotonic()
        problems += project.wait_equal(timeout_s=420)
        reports.append(_report("round 2, no change follows", problems, time.monotonic() - started))
        assert not writer.errors, writer.errors
    return problems


def _selected() -> list[DdlCase]:
    """Every case, or those named in ``HEADWATER_DDL_CASES`` (comma-separated; to run a part of the matrix)."""
    names = [n for n in os.environ.get("HEADWATER_DDL_CASES", "").split(",") if n]
    return [case for case in default_cases() if not names or case.name in names]


#: The one thing rounds 3 and 4 cannot follow: ``parts`` attaches a partition in round 3 and
#: detaches it in round 4, both while capture is stopped. The catalog afterwards is the one before
#: (same leaf partitions, same storage) and neither DDL writes a row change, so nothing shows that
#: the partition's rows were in the table meanwhile: they get no SCD2 version, and a row changed
#: while it was attached stays in SCD1 (README "Schema changes": run ``headwater source resync``
#: after such DDL). Reported as an expected failure when it is the only difference.
PARTITION_ROUND_TRIP = "parts: a partition attached and detached again while capture was stopped leaves no trace"


def _only_partition_round_trip(problems: list[str]) -> bool:
    """True when every problem is the ``parts`` table's (the feed and every other table are exact)."""
    return all(problem.startswith("parts_") for problem in problems)


@pytest.mark.timeout(1500)  # 15 cases x 4 rounds, each compared by checksum; 10-17 min at load 10-30
def test_ddl_matrix_while_run_follow_streams_and_with_capture_stopped(pg_database, unique_name, tmp_path):
    cases = _selected()
    feed = "rename_column" if any(case.name == "rename_column" for case in cases) else None
    project = DdlProject(pg_database, unique_name("ddm"), tmp_path, cases, feed_case=feed)
    run_log = tmp_path / "run.log"
    reports: list[str] = []
    process = project.follow(run_log)
    stopped_problems: list[str] = []
    try:
        problems = _rounds_while_following(project, cases, reports)
        _stop(process)
        if not problems:
            # Capture (the whole pipeline) stopped during rounds 3 and 4, started after them.
            project.apply(3)
            for case in cases:
                for _ in range(5 if case.born is None else 0):
                    project.touch(case)
            project.apply(4)
            # The tables created in the captured schema (rounds 1 and 2) are loaded from now on.
            project.born_loaded = True
            project.write_config()
            process = project.follow(run_log)
            started = time.monotonic()
            # Rounds 1 and 2 settle in 20-110 s at load 10-30; rounds 3 and 4 (every case re-read
            # or recorded at restart) in 61 s for four cases, 157 s for the full matrix at load ~15.
            exact = [case for case in cases if case.name != "parts"]
            stopped_problems = project.wait_equal(exact, timeout_s=300) if exact else []
            reports.append(
                _report("rounds 3 and 4, capture stopped during them", stopped_problems, time.monotonic() - started)
            )
            if len(exact) < len(cases):
                gap = [p for p in project.problems(project.cases["parts"]) if p not in stopped_problems]
                reports.append(_report("rounds 3 and 4, parts", gap, time.monotonic() - started))
                stopped_problems += gap
    finally:
        _stop(process)
        project.close()
    assert not problems, "\n".join(reports) + "\n" + run_log.read_text()[-4000:]
    assert _only_partition_round_trip(stopped_problems), "\n".join(reports) + "\n" + run_log.read_text()[-4000:]
    if stopped_problems:
        pytest.xfail(PARTITION_ROUND_TRIP + ":\n" + "\n".join(reports))


def test_ddl_matrix_reduced_on_kafka(kafka_broker, pg_database, unique_name, tmp_path):
    names = {"add_default", "rename_column", "alter_using"}
    cases = [case for case in default_cases() if case.name in names]
    log = {"backend": "kafka", "partitions": 2, "kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers}}
    project = DdlProject(pg_database, unique_name("ddk"), tmp_path, cases, log=log, feed_case="rename_column")
    run_log = tmp_path / "run.log"
    reports: list[str] = []
    process = project.follow(run_log)
    try:
        problems = _rounds_while_following(project, cases, reports)
    finally:
        _stop(process)
        project.close()
    assert not problems, "\n".join(reports) + "\n" + run_log.read_text()[-4000:]


#: The cases whose handling differs on Iceberg: renames and promotions are metadata changes there
#: (Delta rewrites the table), re-reads go through its own SCD2 writer. The rest is format-free
#: (``real -> double`` is the same promotion path as ``int -> bigint``, ``USING`` the same re-read as a default).
ICEBERG_CASES = {"add_default", "rename_column", "widen_int"}


def test_ddl_matrix_reduced_on_iceberg(pg_database, unique_name, tmp_path):
    cases = [case for case in default_cases() if case.name in ICEBERG_CASES]
    project = DdlProject(pg_database, unique_name("ddi"), tmp_path, cases, table_format="iceberg")
    run_log = tmp_path / "run.log"
    reports: list[str] = []
    process = project.follow(run_log)
    try:
        problems = _rounds_while_following(project, cases, reports)
    finally:
        _stop(process)
        project.close()
    assert not problems, "\n".join(reports) + "\n" + run_log.read_text()[-4000:]


@pytest.mark.timeout(1200)  # five CLI runs starting Spark
def test_iceberg_refuses_a_decimal_scale_change_in_one_line_and_reprocess_makes_it_exact(
    pg_database, unique_name, tmp_path
):
    """numeric(8,2) -> numeric(14,4): Iceberg has no such promotion; the load stops before writing, status says why."""
    cases = [case for case in default_cases() if case.name == "widen_numeric"]
    project = DdlProject(pg_database, unique_name("ddn"), tmp_path, cases, table_format="iceberg")
    source = project.source
    try:
        project.cli("capture", source, "--until-caught-up")
        project.cli("load", "--available-now")
        assert not project.wait_equal(timeout_s=5)
        project.apply(1)
        for case in cases:
            project.touch(case)
        project.cli("capture", source, "--until-caught-up")
        versions = {t: format_of(project.config, t).open(table_path(project.config, t)).version() for t in TABLES}
        refused = project.cli("load", "--available-now", check=False)
        assert refused.returncode != 0
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), refused.stderr
        assert "'price' from decimal(8, 2) to decimal(14, 4)" in lines[0] and "reprocess" in lines[0], lines[0]
        for table, version in versions.items():  # nothing was written
            assert format_of(project.config, table).open(table_path(project.config, table)).version() == version
        status = project.cli("status", check=False).stdout
        assert "'price'" in status and "reprocess" in status, status
        for table in TABLES:
            project.cli("reprocess", table)
        project.cli("load", "--available-now")
        assert not project.wait_equal(timeout_s=5)
    finally:
        project.close()
