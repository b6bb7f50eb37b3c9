"""``headwater source add/show/remove`` against a real PostgreSQL, through the CLI in a subprocess.

Every test gets its own database and its own source name (slots are cluster-wide,
so the default slot ``headwater_<source>`` must differ per test). Failures must exit
non-zero with one line on stderr, create nothing and leave the config unchanged.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import psycopg
import pytest
from psycopg import sql

from capture.postgres.registration.prerequisites import CaptureRequest, SourceFacts, find_problems
from core.config import load_config
from operations.embedded_postgres import EmbeddedPostgres, free_port
from operations.scaffold import init_project

pytestmark = pytest.mark.integration

EVIL = 'x"; drop table y; --'
PW_VAR = "HW_TEST_SOURCE_PW"


def private_dir(prefix: str) -> Path:
    # Not under pytest's basetemp: each new pytest session chmods /tmp/pytest-of-<user> to 0700,
    # and then the server (running as nobody) can no longer reach its data directory.
    return Path(tempfile.mkdtemp(prefix=f"hw-{prefix}-"))


@pytest.fixture
def server(pg_server: EmbeddedPostgres) -> EmbeddedPostgres:
    """The harness's session Postgres (tests/conftest.py)."""
    # Workaround until the harness keeps its data dir outside pytest's basetemp: every new
    # pytest session on this machine chmods /tmp/pytest-of-<user> back to 0700, after which
    # the server (running as nobody) cannot reach its data directory and PANICs.
    for parent in pg_server.data_dir.parents:
        mode = parent.stat().st_mode
        if os.geteuid() == 0 and not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)
    return pg_server


@pytest.fixture(scope="module")
def replica_server() -> Iterator[EmbeddedPostgres]:
    """A second server with wal_level=replica: logical decoding is impossible there."""
    directory = private_dir("pg-replica")
    pg = EmbeddedPostgres(directory / "data", settings={"wal_level": "replica"})
    pg.start()
    yield pg
    pg.stop()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    directory = private_dir("reg")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Source:
    """One test's database, source name and config file."""

    server: EmbeddedPostgres
    db: str
    name: str
    config: Path

    def sql(self, statement: str | sql.Composable, params: tuple[object, ...] = ()) -> list[tuple]:
        with psycopg.connect(self.server.dsn(self.db), autocommit=True) as conn:
            cur = conn.execute(statement, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description is not None else []

    @property
    def dsn(self) -> str:
        """Superuser DSN with the password as a ${VAR} reference (what the docs recommend)."""
        return f"postgresql://postgres:${{{PW_VAR}}}@127.0.0.1:{self.server.port}/{self.db}"

    def role_dsn(self, role: str, password: str) -> str:
        return f"postgresql://{role}:{password}@127.0.0.1:{self.server.port}/{self.db}"

    def headwater(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, PW_VAR: self.server.password}
        return subprocess.run(
            [sys.executable, "-m", "headwater", "--config", str(self.config), *args],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            env=env,
        )

    def add(self, *args: str, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.headwater("source", "add", self.name, "--dsn", dsn or self.dsn, *args, "--yes")

    def slot_exists(self, slot: str | None = None) -> bool:
        rows = self.sql("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot or f"headwater_{self.name}",))
        return bool(rows)

    def published(self, publication: str | None = None) -> set[tuple[str, str]]:
        rows = self.sql(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
            (publication or f"headwater_{self.name}",),
        )
        return {(s, t) for s, t in rows}

    def publication_exists(self, publication: str | None = None) -> bool:
        rows = self.sql("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication or f"headwater_{self.name}",))
        return bool(rows)


@pytest.fixture
def source(server: EmbeddedPostgres, tmp_path: Path, unique_name: Callable[[str], str]) -> Iterator[Source]:
    db = unique_name("reg")
    server.create_database(db)
    config = init_project(tmp_path, "regtest")
    with config.open("a") as handle:
        handle.write("# a comment the user wrote, which must survive every edit\n")
    # Slots are cluster-wide: a unique source name gives a unique default slot headwater_<source>.
    yield Source(server, db, unique_name("src"), config)
    server.drop_database(db)


@pytest.fixture
def role(source: Source, unique_name: Callable[[str], str]) -> Iterator[tuple[str, str]]:
    """A fresh login role (cluster-wide, so uniquely named) with a password; dropped afterwards."""
    name, password = unique_name("cap"), uuid.uuid4().hex
    source.sql(sql.SQL("CREATE ROLE {} WITH LOGIN PASSWORD {}").format(sql.Identifier(name), sql.Literal(password)))
    yield name, password
    source.server.drop_database(source.db)  # the role owns nothing then; the fixture's own drop is a no-op
    source.server.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def assert_nothing_created(source: Source) -> None:
    assert not source.slot_exists()
    assert not source.publication_exists()
    assert source.name not in load_config(source.config).sources


# -- happy paths ------------------------------------------------------------------------------


def test_add_tables_show_remove(source: Source) -> None:
    source.sql("CREATE TABLE customers (id int PRIMARY KEY, email text)")
    source.sql("CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int)")
    result = source.add("--tables", "public.customers, Public.Orders")
    assert result.returncode == 0, result.stderr
    assert f"registered source {source.name}" in result.stdout
    # The superuser works, with a warning; the ${VAR} DSN gets no literal-password warning.
    assert "is a superuser: this works, but prefer a least-privilege role" in result.stderr
    assert "literal password" not in result.stderr

    assert source.published() == {("public", "customers"), ("public", "orders")}
    slot = source.sql(
        "SELECT plugin, database, active FROM pg_replication_slots WHERE slot_name = %s", (f"headwater_{source.name}",)
    )
    assert slot == [("pgoutput", source.db, False)]
    via_root = source.sql("SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (f"headwater_{source.name}",))
    assert via_root == [(True,)]

    text = source.config.read_text()
    assert "# a comment the user wrote" in text and "# Derived feeds" in text and "${" + PW_VAR + "}" in text
    os.environ[PW_VAR] = source.server.password
    try:
        configured = load_config(source.config).sources[source.name]
    finally:
        del os.environ[PW_VAR]
    assert configured.tables == ("public.customers", "public.orders")
    assert configured.slot == f"headwater_{source.name}"

    shown = source.headwater("source", "show", source.name)
    assert shown.returncode == 0, shown.stderr
    assert "postgres:***@" in shown.stdout and source.server.password not in shown.stdout
    assert "inactive" in shown.stdout
    as_json = orjson.loads(source.headwater("source", "show", source.name, "--json").stdout)
    assert as_json["dsn"].startswith("postgresql://postgres:***@")
    status = as_json["slot_status"]
    assert status["active"] is False and status["plugin"] == "pgoutput" and status["wal_status"] == "reserved"
    assert "/" in status["confirmed_flush_lsn"] and status["wal_retained_bytes"] >= 0
    assert as_json["publication_status"]["tables"] == ["public.customers", "public.orders"]

    again = source.add("--tables", "public.customers")
    assert "already registered" in one_line_error(again)

    removed = source.headwater("source", "remove", source.name, "--yes")
    assert removed.returncode == 0, removed.stderr
    assert not source.slot_exists() and not source.publication_exists()
    text = source.config.read_text()
    assert source.name not in text
    assert "# a comment the user wrote" in text and "# Derived feeds" in text
    assert load_config(source.config).sources == {}


def test_add_schemas(source: Source) -> None:
    source.sql('CREATE SCHEMA "Sales"')
    source.sql('CREATE TABLE "Sales".a (id int PRIMARY KEY)')
    source.sql('CREATE TABLE "Sales"."B" (id int PRIMARY KEY)')
    result = source.add("--schemas", '"Sales"', "--slot", f"s_{source.name}", "--publication", "Pub Sales")
    assert result.returncode == 0, result.stderr
    assert source.published("Pub Sales") == {("Sales", "a"), ("Sales", "B")}
    assert source.sql("SELECT count(*) FROM pg_publication_namespace") == [(1,)]
    assert source.slot_exists(f"s_{source.name}")
    assert "schemas:" in source.config.read_text()
    removed = source.headwater("source", "remove", source.name, "--yes")
    assert removed.returncode == 0, removed.stderr
    assert not source.publication_exists("Pub Sales") and not source.slot_exists(f"s_{source.name}")


def test_literal_password_warns(source: Source) -> None:
    source.sql("CREATE TABLE t (id int PRIMARY KEY)")
    result = source.add("--tables", "public.t", dsn=source.server.dsn(source.db))
    assert result.returncode == 0, result.stderr
    assert "literal password" in result.stderr and "${" in result.stderr
    assert source.server.password not in result.stderr + result.stdout


def test_evil_table_name_end_to_end(source: Source) -> None:
    source.sql("CREATE TABLE y (id int PRIMARY KEY)")
    source.sql(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier("public", EVIL)))
    quoted = '"' + EVIL.replace('"', '""') + '"'
    result = source.add("--tables", f"public.{quoted},public.y")
    assert result.returncode == 0, result.stderr
    assert source.published() == {("public", EVIL), ("public", "y")}
    assert source.sql("SELECT count(*) FROM y") == [(0,)]  # y was not dropped
    os.environ[PW_VAR] = source.server.password
    try:
        assert load_config(source.config).sources[source.name].tables == (f"public.{quoted}", "public.y")
    finally:
        del os.environ[PW_VAR]
    shown = orjson.loads(source.headwater("source", "show", source.name, "--json").stdout)
    assert shown["publication_status"]["tables"] == [f"public.{quoted}", "public.y"]


def test_least_privilege_role_with_precreated_publication(source: Source, role: tuple[str, str]) -> None:
    name, password = role
    source.sql("CREATE TABLE t (id int PRIMARY KEY)")
    source.sql(sql.SQL("ALTER ROLE {} WITH REPLICATION").format(sql.Identifier(name)))
    source.sql(sql.SQL("GRANT SELECT ON public.t TO {}").format(sql.Identifier(name)))

    # Without the publication the role cannot create one: the error names the SQL an owner must run.
    refused = source.add("--tables", "public.t", dsn=source.role_dsn(name, password))
    line = one_line_error(refused)
    assert f"cannot create publication headwater_{source.name}" in line
    assert f'CREATE PUBLICATION "headwater_{source.name}" FOR TABLE "public"."t"' in line
    assert password not in refused.stderr
    assert_nothing_created(source)

    source.sql(f"CREATE PUBLICATION headwater_{source.name} FOR TABLE public.t WITH (publish_via_partition_root)")
    result = source.add("--tables", "public.t", dsn=source.role_dsn(name, password))
    assert result.returncode == 0, result.stderr
    assert "(reused)" in result.stdout
    assert "superuser" not in result.stderr
    assert source.slot_exists()

    removed = source.headwater("source", "remove", source.name, "--yes")
    assert removed.returncode == 0, removed.stderr
    assert not source.slot_exists()
    # Not ours to drop: an admin created it; the note says how to drop it.
    assert source.publication_exists()
    assert "was not created by Headwater" in removed.stderr


def test_remove_without_yes_and_without_terminal_refuses(source: Source) -> None:
    source.sql("CREATE TABLE t (id int PRIMARY KEY)")
    assert source.add("--tables", "public.t").returncode == 0
    line = one_line_error(source.headwater("source", "remove", source.name))
    assert "pass --yes" in line
    assert source.slot_exists() and source.publication_exists()


# -- each prerequisite failure: exit != 0, one line, nothing created ---------------------------


def test_wal_level_not_logical(
    replica_server: EmbeddedPostgres, tmp_path: Path, unique_name: Callable[[str], str]
) -> None:
    db = unique_name("reg")
    replica_server.create_database(db)
    replica_server.execute("CREATE TABLE t (id int PRIMARY KEY)", dbname=db)
    src = Source(replica_server, db, unique_name("src"), init_project(tmp_path, "walproj"))
    line = one_line_error(src.add("--tables", "public.t"))
    assert "wal_level is replica" in line
    assert "set wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart" in line
    assert_nothing_created(src)


def test_no_replication_privilege(source: Source, role: tuple[str, str]) -> None:
    name, password = role
    source.sql("CREATE TABLE t (id int PRIMARY KEY)")
    source.sql(sql.SQL("GRANT SELECT ON public.t TO {}").format(sql.Identifier(name)))
    source.sql(f"CREATE PUBLICATION headwater_{source.name} FOR TABLE public.t WITH (publish_via_partition_root)")
    line = one_line_error(source.add("--tables", "public.t", dsn=source.role_dsn(name, password)))
    assert f"role {name} lacks the REPLICATION attribute" in line
    assert f'ALTER ROLE "{name}" WITH REPLICATION' in line
    assert not source.slot_exists()


def test_missing_select(source: Source, role: tuple[str, str]) -> None:
    name, password = role
    source.sql("CREATE TABLE t (id int PRIMARY KEY)")
    source.sql(sql.SQL("ALTER ROLE {} WITH REPLICATION").format(sql.Identifier(name)))
    source.sql(f"CREATE PUBLICATION headwater_{source.name} FOR TABLE public.t WITH (publish_via_partition_root)")
    result = source.add("--tables", "public.t", dsn=source.role_dsn(name, password))
    line = one_line_error(result)
    assert f"role {name} lacks SELECT on public.t" in line
    assert f'GRANT SELECT ON "public"."t" TO "{name}"' in line
    assert password not in result.stderr
    assert not source.slot_exists()


def test_missing_table(source: Source) -> None:
    line = one_line_error(source.add("--tables", "public.nope"))
    assert f"table public.nope does not exist in database {source.db}" in line
    assert_nothing_created(source)


def test_table_without_key_and_default_replica_identity(source: Source) -> None:
    source.sql("CREATE TABLE nokey (a int)")
    line = one_line_error(source.add("--tables", "public.nokey"))
    assert "public.nokey has no primary key and REPLICA IDENTITY DEFAULT" in line
    assert 'ALTER TABLE "public"."nokey" REPLICA IDENTITY FULL' in line
    assert_nothing_created(source)
    source.sql("ALTER TABLE nokey REPLICA IDENTITY FULL")
    assert source.add("--tables", "public.nokey").returncode == 0


def test_slot_name_taken(source: Source) -> None:
    source.sql("CREATE TABLE t (id int PRIMARY KEY)")
    taken = f"taken_{source.name}"
    source.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (taken,))
    try:
        line = one_line_error(source.add("--tables", "public.t", "--slot", taken))
        assert f"replication slot {taken} already exists" in line and "--slot NAME" in line
        assert not source.publication_exists()
    finally:
        source.sql("SELECT pg_drop_replication_slot(%s)", (taken,))


def test_publication_with_other_tables(source: Source) -> None:
    source.sql("CREATE TABLE t (id int PRIMARY KEY)")
    source.sql("CREATE TABLE other (id int PRIMARY KEY)")
    source.sql(f"CREATE PUBLICATION headwater_{source.name} FOR TABLE other")
    line = one_line_error(source.add("--tables", "public.t"))
    assert f"publication headwater_{source.name} already exists with tables public.other, not tables public.t" in line
    assert source.published() == {("public", "other")}
    assert not source.slot_exists()


def test_several_problems_in_one_line(source: Source) -> None:
    source.sql("CREATE TABLE nokey (a int)")
    line = one_line_error(source.add("--tables", "public.nokey,public.missing"))
    assert "fails 2 prerequisite checks: (1)" in line and "(2)" in line


def test_bad_dsn_syntax(source: Source) -> None:
    secret = "S3cretXyz%zz"
    for dsn in (f"host=127.0.0.1 password={secret} garbage", f"postgresql://u:{secret}@127.0.0.1:5432/db"):
        result = source.add("--tables", "public.t", dsn=dsn)
        line = one_line_error(result)
        assert "invalid DSN" in line
        assert "S3cret" not in result.stderr + result.stdout
    assert_nothing_created(source)


def test_wrong_password(source: Source) -> None:
    secret = "WrongPassw0rd-7"
    result = source.add("--tables", "public.t", dsn=source.role_dsn("postgres", secret))
    line = one_line_error(result)
    assert "password authentication failed" in line and "check the user and password" in line
    assert secret not in result.stderr + result.stdout
    assert_nothing_created(source)


def test_unreachable_host(source: Source) -> None:
    port = free_port()
    result = source.add("--tables", "public.t", dsn=f"postgresql://u:Secr3tpw@127.0.0.1:{port}/db")
    line = one_line_error(result)
    assert f"cannot reach PostgreSQL at 127.0.0.1:{port}" in line
    assert "Secr3tpw" not in result.stderr
    assert_nothing_created(source)


# -- checks without a server: version and capacity ----------------------------------------------


def test_version_and_capacity_checks() -> None:
    request = CaptureRequest(source="s", slot="headwater_s", publication="headwater_s", tables=())
    old = find_problems(SourceFacts(server_version=130011, server_version_text="13.11"), request)
    assert [p.check for p in old] == ["server_version"] and "needs 14 or newer" in old[0].message
    full = SourceFacts(
        server_version=150000,
        server_version_text="15.0",
        role="capture",
        has_replication=True,
        can_create_in_database=True,
        wal_level="logical",
        max_replication_slots=4,
        slots_used=4,
        max_wal_senders=4,
        wal_senders_used=4,
    )
    checks = {p.check: p.message for p in find_problems(full, request)}
    assert "4 of max_replication_slots = 4 in use" in checks["free_slot"]
    assert "4 of max_wal_senders = 4 in use" in checks["free_wal_sender"]
    schemas = CaptureRequest(source="s", slot="headwater_s", publication="headwater_s", schemas=("public",))
    on_14 = find_problems(SourceFacts(server_version=140005, server_version_text="14.5", wal_level="logical"), schemas)
    assert any("--schemas needs PostgreSQL 15" in p.message for p in on_14)
