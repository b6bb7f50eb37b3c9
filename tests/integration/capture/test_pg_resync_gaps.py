"""PostgreSQL resync: captured tables dropped while the slot was gone, and keyless tables, through the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import psycopg
import yaml
from harness.topics import read_topic

from log.file.backend import FileLog
from log.topics import table_topic

ROOT = Path(__file__).resolve().parents[3]
PASSWORD_VAR = "HW_PGR_PASSWORD"


class Project:
    def __init__(self, server, name: str, tmp_path: Path, *statements: str, tables: str) -> None:
        server.create_database(name)
        self.name, self.dsn, self.password = name, server.dsn(name), server.password
        self.dir = tmp_path / "project"
        self.dir.mkdir()
        self.config = self.dir / "headwater.yaml"
        self.config.write_text(f"project: pgr\nhome: {self.dir / 'home'}\nsources: {{}}\n")
        for statement in statements:
            self.execute(statement)
        masked = self.dsn.replace(self.password, "${" + PASSWORD_VAR + "}")
        added = self.cli("source", "add", name, "--dsn", masked, "--tables", tables, "--snapshot", "initial", "--yes")
        assert added.returncode == 0, added.stderr

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), PASSWORD_VAR: self.password}
        command = [sys.executable, "-m", "headwater", "--config", str(self.config), *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)

    def execute(self, statement: str) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(statement)

    def publication(self) -> str:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pubname FROM pg_publication").fetchone()
        assert row is not None
        return row[0]

    def records(self, table: str) -> list:
        with FileLog(self.dir / "home" / "log") as log:
            topic = table_topic(self.name, "public", table)
            return read_topic(log, topic) if topic in log.list_topics() else []

    def gap_then_resync(self, *while_gone: str) -> None:
        """Capture, drop the slot, run ``while_gone``, request the resync."""
        done = self.cli("capture", "--until-caught-up")
        assert done.returncode == 0, done.stderr
        self.execute(f"SELECT pg_drop_replication_slot('headwater_{self.name}')")
        for statement in while_gone:
            self.execute(statement)
        resync = self.cli("source", "resync", self.name, "--yes")
        assert resync.returncode == 0, resync.stderr

    @property
    def request(self) -> Path:
        return self.dir / "home" / "capture" / self.name / "resync.json"


def live_ids(records: list) -> set[int]:
    """Ids live at the end of a topic (keyless rows count by their image; a truncate empties the topic)."""
    latest: dict[object, tuple[tuple[int, int], bool]] = {}
    for record in records:
        if record.value is None:
            continue
        event = orjson.loads(record.value)
        at = (event["source"]["commit_lsn"], event["source"]["txn_index"])
        if event["op"] == "t":
            latest = {k: (seq, False) for k, (seq, _) in latest.items() if seq > at}
            continue
        row = event["after"] or event["before"]
        key = record.key or orjson.dumps(row)
        if key not in latest or latest[key][0] < at:
            latest[key] = (at, event["op"] != "d")
    return {orjson.loads(k)["id"] for k, (_, live) in latest.items() if live}


def test_resync_deletes_the_rows_of_a_table_dropped_meanwhile(pg_server, unique_name, tmp_path):
    """A captured table dropped while the slot was gone: every key its topic holds live is deleted.

    One that exists but is not published (re-created under its name, or taken out of the
    publication) is refused in one line until it is published again, then re-read.
    """
    project = Project(
        pg_server,
        unique_name("pgr"),
        tmp_path,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "CREATE TABLE d (id int PRIMARY KEY, v text)",
        "CREATE TABLE k (id int, v text)",
        "ALTER TABLE k REPLICA IDENTITY FULL",
        "INSERT INTO t SELECT g, 't' FROM generate_series(1, 5) g",
        "INSERT INTO d SELECT g, 'd' FROM generate_series(1, 6) g",
        "INSERT INTO k SELECT g, 'k' FROM generate_series(1, 3) g",
        # Its topic's name is p_1 (made Kafka-safe): the catalog is asked for the events' name, p$1.
        "CREATE TABLE p$1 (id int PRIMARY KEY, v text)",
        "INSERT INTO p$1 SELECT g, 'p' FROM generate_series(1, 4) g",
        "CREATE TABLE r (id int PRIMARY KEY, v text)",
        "INSERT INTO r SELECT g, 'old' FROM generate_series(1, 4) g",
        tables="public.t,public.d,public.k,public.p$1,public.r",
    )
    publication = project.publication()
    project.gap_then_resync(
        "DROP TABLE d",
        "DROP TABLE k",
        "DELETE FROM t WHERE id = 1",
        # Taken out of the publication (it still exists), and dropped and re-created under its name.
        f"ALTER PUBLICATION {publication} DROP TABLE p$1",
        "DELETE FROM p$1 WHERE id = 1",
        "DROP TABLE r",
        "CREATE TABLE r (id int PRIMARY KEY, v text)",
        "INSERT INTO r SELECT g, 'new' FROM generate_series(3, 6) g",
    )
    before = {table: project.records(table) for table in ("t", "d", "k", "p$1", "r")}
    assert before["p$1"] and before["r"]
    refused = project.cli("capture", "--until-caught-up")
    lines = [line for line in refused.stderr.splitlines() if "does not publish it" in line]
    assert refused.returncode != 0 and len(lines) == 1, refused.stderr
    assert f"table public.p$1 is captured but publication {publication} does not publish it" in lines[0], lines[0]
    assert f"ALTER PUBLICATION {publication} ADD TABLE public.p$1" in lines[0], lines[0]
    assert {table: project.records(table) for table in before} == before, "the refusal appended"
    assert project.request.exists(), "the resync is no longer requested"

    project.execute(f"ALTER PUBLICATION {publication} ADD TABLE p$1")
    refused = project.cli("capture", "--until-caught-up")
    assert refused.returncode != 0 and "table public.r is captured but" in refused.stderr, refused.stderr
    project.execute(f"ALTER PUBLICATION {publication} ADD TABLE r")
    done = project.cli("capture", "--until-caught-up")
    assert done.returncode == 0, done.stderr
    assert live_ids(project.records("t")) == {2, 3, 4, 5}
    assert live_ids(project.records("d")) == set(), "the dropped table's rows are still live"
    assert live_ids(project.records("k")) == set(), "the dropped keyless table's rows are still live"
    assert live_ids(project.records("p$1")) == {2, 3, 4}
    assert live_ids(project.records("r")) == {3, 4, 5, 6}, "the re-created table's old rows are still live"
    assert not project.request.exists()


def test_resync_refuses_a_keyless_table(pg_server, unique_name, tmp_path):
    """A keyless table that still exists: refused in one line, nothing appended, the resync stays requested."""
    project = Project(
        pg_server,
        unique_name("pgr"),
        tmp_path,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "CREATE TABLE n (id int, v text)",
        "ALTER TABLE n REPLICA IDENTITY FULL",
        "INSERT INTO t SELECT g, 't' FROM generate_series(1, 5) g",
        "INSERT INTO n SELECT g, 'n' FROM generate_series(1, 5) g",
        tables="public.t,public.n",
    )
    project.gap_then_resync("DELETE FROM n WHERE id <= 2")
    before = {table: project.records(table) for table in ("t", "n")}
    refused = project.cli("capture", "--until-caught-up")
    lines = [line for line in refused.stderr.splitlines() if "no primary key" in line]
    assert refused.returncode != 0 and len(lines) == 1, refused.stderr
    assert "table public.n has no primary key and no configured key" in lines[0]
    assert f"sources.{project.name}.keys" in lines[0] and f"'headwater capture {project.name}' again" in lines[0]
    assert {table: project.records(table) for table in ("t", "n")} == before, "the refusal appended"
    assert project.request.exists(), "the resync is no longer requested"

    # With a configured key the resync proceeds and both tables converge: n's keyless events (rows 1
    # and 2 among them, deleted meanwhile) are emptied by one truncate before its re-snapshot.
    document = yaml.safe_load(project.config.read_text())
    document["sources"][project.name]["keys"] = {"public.n": ["id"]}
    project.config.write_text(yaml.safe_dump(document))
    done = project.cli("capture", "--until-caught-up")
    assert done.returncode == 0, done.stderr
    assert live_ids(project.records("t")) == {1, 2, 3, 4, 5}
    assert live_ids(project.records("n")) == {3, 4, 5}, "rows deleted while the slot was gone are live"
    n_ops = [orjson.loads(r.value)["op"] for r in project.records("n") if r.value is not None]
    assert n_ops.count("t") == 1, n_ops
    assert not project.request.exists()
