"""Errors raised inside Spark reach the CLI's one ``error:`` line with their own text (issue 31).

A Headwater error raised in a Spark Python worker (the ``headwater_log`` source reading a
partition on an executor, or planning a query in its planner process) used to reach the CLI as
``the Spark job failed: ...PythonException: An exception was thrown from the Python worker``;
its cause was only in ``spark.log``. Each case here damages a copy of a captured project's log
(or configures what cannot work) and runs ``load --available-now``, ``feeds run
--available-now`` or ``run --until-caught-up`` (those whose path to it differs, see
:func:`cases`) through the real CLI: each must exit 3 with ONE
line on stderr naming the cause (no traceback, no "Spark job failed"), commit nothing, leave
the damaged bytes as they were, and ``headwater status`` must show the stage's last error.

Raised inside Spark tasks: a flipped byte in a closed segment, a closed segment cut short,
a value that does not fit its column's recorded type (executors reading partitions), a topic
whose files are gone, two topics read together giving a column two types (the source's
planner process). Raised in a micro-batch on the driver: two rows of a feed's SQL with one key.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
import yaml
from harness.names import NameFactory
from psycopg import sql

from log.base import Record
from log.file.backend import FileLog

pytestmark = pytest.mark.integration

PASSWORD = "Spark-Task-Pw-4Kq81"
PW_VAR = "HW_TASK_ERRORS_PW"
CUSTOMERS = 60


@dataclass
class Shop:
    """A captured project: customers (id, name, n int) and items (id, n text), one partition, tiny segments."""

    directory: Path
    source: str
    server: Any
    db: str

    @property
    def config(self) -> Path:
        return self.directory / "headwater.yaml"

    @property
    def home(self) -> Path:
        return self.directory / ".headwater"

    def topic(self, table: str) -> str:
        return f"{self.source}.public.{table}"

    def headwater(self, config: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "headwater", "--config", str(config), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env={**os.environ, PW_VAR: PASSWORD},
        )

    def sql(self, statement: str, params: tuple[object, ...] = ()) -> None:
        with psycopg.connect(self.server.dsn(self.db), autocommit=True) as conn:
            conn.execute(statement, params)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def shop(pg_server: Any) -> Iterator[Shop]:
    names = NameFactory(__name__)
    db, source = names("tasks"), names("shop")
    pg_server.create_database(db)
    directory = Path(tempfile.mkdtemp(prefix="hw-task-errors-"))
    directory.chmod(0o755)
    project = Shop(directory, source, pg_server, db)
    project.sql("CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, n int)")
    project.sql("CREATE TABLE items (id int PRIMARY KEY, n text)")
    project.sql(f"INSERT INTO customers SELECT g, 'customer ' || g, g FROM generate_series(1, {CUSTOMERS}) g")
    project.sql("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 5) g")
    project.sql(f"CREATE PUBLICATION headwater_{source} FOR TABLE customers, items")
    dsn = pg_server.dsn(db).replace(pg_server.password, "${" + PW_VAR + "}")
    document = {
        "project": "tasks",
        "log": {"partitions": 1, "file": {"segment_bytes": 256}},
        "sources": {source: {"dsn": dsn, "tables": ["public.customers", "public.items"]}},
    }
    project.config.write_text(yaml.safe_dump(document))
    env_config = project.config
    pg_password = pg_server.password
    first = subprocess.run(
        [sys.executable, "-m", "headwater", "--config", str(env_config), "capture", "--until-caught-up"],
        capture_output=True,
        text=True,
        env={**os.environ, PW_VAR: pg_password},
        timeout=300,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    for round_ in range(3):  # one batch per run: several closed segments
        project.sql("UPDATE customers SET n = n + 1 WHERE id <= %s", (10 * (round_ + 1),))
        again = subprocess.run(
            [sys.executable, "-m", "headwater", "--config", str(env_config), "capture", "--until-caught-up"],
            capture_output=True,
            text=True,
            env={**os.environ, PW_VAR: pg_password},
            timeout=300,
        )
        assert again.returncode == 0, again.stderr[-3000:]
    try:
        yield project
    finally:
        pg_server.execute(
            sql.SQL("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = {}").format(
                sql.Literal(db)
            )
        )
        pg_server.drop_database(db)
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Case:
    """A copy of the shop's log, damaged by ``damage``, with ``feeds`` and ``tables`` configured."""

    name: str
    damage: Callable[[Shop, Path], Callable[[], None]]
    expect: tuple[str, ...]
    feeds: dict[str, Any]
    tables: dict[str, Any]
    commands: tuple[str, ...]


def customers_segments(shop: Shop, home: Path) -> list[Path]:
    segments = sorted((home / "log" / shop.topic("customers") / "0").glob("*.log"))
    assert len(segments) >= 3, segments
    return segments


def flip_a_byte(shop: Shop, home: Path) -> Callable[[], None]:
    segment = customers_segments(shop, home)[0]
    damaged = bytearray(segment.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # one flipped byte inside a closed segment
    segment.write_bytes(damaged)

    def unchanged() -> None:
        assert segment.read_bytes() == damaged, "the damaged segment was changed"

    return unchanged


def cut_short(shop: Shop, home: Path) -> Callable[[], None]:
    segment = customers_segments(shop, home)[1]
    size = segment.stat().st_size
    os.truncate(segment, size - 7)  # acknowledged data missing: not a torn tail

    def unchanged() -> None:
        assert segment.stat().st_size == size - 7

    return unchanged


def undecodable_value(shop: Shop, home: Path) -> Callable[[], None]:
    with FileLog(home / "log") as log:
        last = orjson.loads(
            log.read(shop.topic("customers"), 0, log.end_offset(shop.topic("customers"), 0) - 1)[0].value
        )
        source = {**last["source"], "commit_lsn": last["source"]["commit_lsn"] + 1000, "txn_index": 0}
        event = {**last, "op": "u", "before": None, "after": {"id": 7, "name": "x", "n": "seven"}, "source": source}
        log.append(shop.topic("customers"), 0, [Record(b'{"id":7}', orjson.dumps(event))])
    return lambda: None


def topic_gone(shop: Shop, home: Path) -> Callable[[], None]:
    shutil.rmtree(home / "log" / shop.topic("customers"))  # _headwater.schemas still names it
    return lambda: None


def nothing(shop: Shop, home: Path) -> Callable[[], None]:
    return lambda: None


PROJECTION = {"sql": "SELECT id, name, n FROM source", "key": ["id"]}


def cases(shop: Shop) -> list[Case]:
    customers, items = shop.topic("customers"), shop.topic("items")
    feed = {"clean": {"from": customers, **PROJECTION}}
    table = {"current": {"from": customers, "mode": "scd1"}}
    # Each case runs the commands whose path to the error differs, not all three: every command
    # meets an error on an executor and one on the driver or planner, each at least twice
    # (``run`` reaches a feed's error before any load's), 8 Spark runs instead of 15.
    return [
        Case(
            "corrupt-segment", flip_a_byte, ("corrupt log segment", "restore the file"), feed, table, ("load", "feeds")
        ),
        Case("segment-cut-short", cut_short, ("corrupt log segment", "restore the file"), feed, table, ("run",)),
        Case(
            "undecodable-value",
            undecodable_value,
            ("column 'after.n' holds 'seven'", "which is not a"),
            feed,
            table,
            ("load", "run"),
        ),
        Case("topic-files-gone", topic_gone, (customers, "does not exist"), {}, table, ("load",)),
        Case(
            "column-two-types",
            nothing,
            ("column 'n' is", "in one topic", "read the topics separately"),
            {
                "joined": {
                    "from": customers,
                    "lookups": {"items": items},
                    "sql": "SELECT source.id, items.n FROM source JOIN items ON source.id = items.id",
                    "key": ["id"],
                }
            },
            {},
            ("feeds",),
        ),
        Case(
            "two-rows-one-key",
            nothing,
            ("feed parity", "rows of its SQL have the key", "nothing of this micro-batch was written"),
            {"parity": {"from": customers, "sql": "SELECT id % 2 AS k, name FROM source", "key": ["k"]}},
            {},
            ("run",),
        ),
    ]


COMMANDS = {
    "load": ("load", "--available-now"),
    "feeds": ("feeds", "run", "--available-now"),
    "run": ("run", "--until-caught-up"),
}


def case_config(shop: Shop, case: Case, command: str) -> tuple[Path, Path]:
    """A project directory of its own: the shop's log copied, no source (nothing captures into the copy)."""
    directory = shop.directory / "cases" / f"{case.name}-{command}"
    home = directory / ".headwater"
    shutil.copytree(shop.home / "log", home / "log")
    document = {
        "project": "tasks",
        "home": str(home),
        "log": {"partitions": 1, "file": {"segment_bytes": 256}},
        "feeds": case.feeds if command != "load" else {},
        "warehouse": {"tables": case.tables if command != "feeds" else {}},
    }
    config = directory / "headwater.yaml"
    config.write_text(yaml.safe_dump(document))
    return config, home


def one_error_line(result: subprocess.CompletedProcess[str], expect: tuple[str, ...]) -> str:
    assert result.returncode == 3, f"exit {result.returncode}: {result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    line = errors[0]
    assert "Spark job failed" not in line and "PythonException" not in line, line
    for word in expect:
        assert word in line, f"{word!r} missing from: {line}"
    assert PASSWORD not in result.stdout + result.stderr
    return line


PARAMS = [
    pytest.param(name, command, id=f"{name}-{command}")
    for name, commands in (
        ("corrupt-segment", ("load", "feeds")),
        ("segment-cut-short", ("run",)),
        ("undecodable-value", ("load", "run")),
        ("topic-files-gone", ("load",)),
        ("column-two-types", ("feeds",)),
        ("two-rows-one-key", ("run",)),
    )
    for command in commands
]


@pytest.mark.parametrize(("name", "command"), PARAMS)
def test_an_error_inside_spark_reaches_the_one_error_line(shop: Shop, name: str, command: str) -> None:
    case = next(c for c in cases(shop) if c.name == name)
    assert command in case.commands
    config, home = case_config(shop, case, command)
    unchanged = case.damage(shop, home)
    result = shop.headwater(config, *COMMANDS[command])
    line = one_error_line(result, case.expect)
    unchanged()
    for table in case.tables if command != "feeds" else {}:
        assert not (home / "warehouse" / table / "_delta_log").exists() or name == "two-rows-one-key", "committed"
    status = shop.headwater(config, "status", "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    shown = orjson.loads(status.stdout)
    errors = {row["stage"]: row for row in shown["errors"]}
    stage = " ".join(COMMANDS[command][:-1])  # "load", "feeds run", "run"
    assert errors[stage]["exit_code"] == 3
    assert errors[stage]["error"] == line.removeprefix("error: "), shown["errors"]


def test_a_driver_out_of_memory_stops_in_one_line_not_a_hang(shop: Shop) -> None:
    """A micro-batch larger than the driver's heap: the JVM exits, the CLI says so in one line, nothing waits.

    60 rows of ~30 MB each (``repeat``) against a 512 MB driver. Before, the JVM's task-result
    threads died of ``OutOfMemoryError`` and the job waited forever (a 2M-event backlog, issue 31).
    """
    directory = shop.directory / "cases" / "driver-out-of-memory"
    home = directory / ".headwater"
    shutil.copytree(shop.home / "log", home / "log")
    huge = {"sql": "SELECT id, repeat(name, 3000000) AS big FROM source", "key": ["id"]}
    document = {
        "project": "tasks",
        "home": str(home),
        "log": {"partitions": 1, "file": {"segment_bytes": 256}},
        "spark": {"driver_memory": "512m"},
        "feeds": {"huge": {"from": shop.topic("customers"), **huge}},
    }
    config = directory / "headwater.yaml"
    config.write_text(yaml.safe_dump(document))
    result = shop.headwater(config, *COMMANDS["feeds"], timeout=300)
    line = one_error_line(result, ("Spark's driver ran out of memory (spark.driver_memory 512m)", "driver_memory: 2g"))
    assert "Terminating due to" not in result.stdout + result.stderr
    with FileLog(home / "log") as log:
        assert "huge" not in log.list_topics() or log.end_offset("huge", 0) == 0, "records of the batch were appended"
    status = orjson.loads(shop.headwater(config, "status", "--json").stdout)
    assert {row["stage"]: row["error"] for row in status["errors"]}["feeds run"] == line.removeprefix("error: ")


SLOW_PYTHON = """#!/bin/sh
# Spark's Python workers start through this; while {mark} exists, each one Spark launches on
# its own (not pyspark.daemon's forks) sleeps past Spark's fixed 10 s before starting.
echo "$*" >> {calls}
case " $* " in
  *" pyspark.daemon "*) ;;
  *) [ -e {mark} ] && sleep 12 ;;
esac
exec {python} "$@"
"""


def test_a_python_worker_too_slow_to_start_is_transient_and_the_load_runs_again(shop: Shop) -> None:
    """A machine so busy that a Python worker Spark starts misses Spark's 10 s to connect back.

    CI saw it mid-``run --follow``: ``load`` stopped with "the Spark job failed: ... Python worker
    failed to connect back" and exit 3, so ``run`` left it stopped for an operator and the tables
    stayed empty. It is the machine's load, not the data: one line saying so, exit 1 (transient:
    ``run`` restarts the stage), nothing committed; run again on a quiet machine, it loads.
    """
    case = Case("slow-worker", nothing, (), {}, {"current": {"from": shop.topic("customers"), "mode": "scd1"}}, ())
    config, home = case_config(shop, case, "load")
    mark, calls = config.parent / "slow", config.parent / "python-calls"
    python = config.parent / "slow-python"
    python.write_text(SLOW_PYTHON.format(mark=mark, calls=calls, python=sys.executable))
    python.chmod(0o755)
    mark.touch()
    env = {**os.environ, "PYSPARK_PYTHON": str(python)}

    def load() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "headwater", "--config", str(config), *COMMANDS["load"]],
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
            env=env,
        )

    slow = load()
    assert slow.returncode == 1, f"exit {slow.returncode}: {slow.stderr[-3000:]}"
    assert slow.stderr.strip().splitlines()[-1:] == [
        f"error: a Spark Python worker did not start within Spark's 10 s (the machine is overloaded: see its "
        f"load and memory); run the command again (headwater run restarts it by itself); details in "
        f"{home / 'logs' / 'spark.log'}"
    ], slow.stderr[-3000:]
    assert "Traceback" not in slow.stderr and "nanobind" not in slow.stderr, slow.stderr[-3000:]
    # Spark 4.3 forks most workers from pyspark.daemon (not slowed); its streaming source runs on its own.
    alone = [line for line in calls.read_text().splitlines() if "pyspark.daemon" not in line]
    assert alone == ["-m pyspark.sql.streaming.python_streaming_source_runner"], calls.read_text()
    assert not (home / "warehouse" / "current" / "_delta_log").exists(), "committed"
    mark.unlink()
    again = load()
    assert again.returncode == 0, again.stderr[-3000:]
    query = shop.headwater(config, "query", "SELECT count(*) AS n, sum(n) AS total FROM current")
    assert query.returncode == 0, query.stderr[-3000:]
    # ids 1..60 hold n = id, +1 for each of the three rounds that updated them (ids <= 10, 20, 30).
    expected = sum(range(1, CUSTOMERS + 1)) + 10 * 3 + 10 * 2 + 10 * 1
    assert f"{CUSTOMERS}" in query.stdout and f"{expected}" in query.stdout, query.stdout
