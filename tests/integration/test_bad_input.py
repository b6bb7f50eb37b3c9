"""Bad-input catalogue, part 2: bad input that needs real services, through the real CLI (issue 9).

One module-scoped project (``shop``) is registered and captured once through the CLI:
a least-privilege role with a distinctive password given as ``${VAR}``, one partition
per topic and tiny file-log segments (so a partition spans several segment files). Each
case then runs ``headwater --config ... <command>`` in a subprocess and asserts: exit
code non-zero, exactly one ``error:`` line on stderr (no traceback) naming the problem
and what to do, the password nowhere in stdout/stderr, and every record captured before
still in the log, unchanged and at the same offsets.

The data cases at the end (huge value, non-UTF-8 bytes, NUL bytes, huge transaction)
are input that must be *captured*, not refused: they assert exactly what reaches the log.
The broken-config cases that need no service are in ``tests/unit/test_bad_input_config.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
import yaml
from harness import topics as harness_topics
from harness.names import NameFactory
from psycopg import sql

from core.config import load_config
from log.factory import open_log
from operations.embedded_postgres import EmbeddedPostgres, free_port

pytestmark = pytest.mark.integration

PASSWORD = "Catalogue-Pw-7Qz93x"  # distinctive: any leak into the output is found
PW_VAR = "HW_BAD_INPUT_PW"
CUSTOMERS = 40


def private_dir(prefix: str) -> Path:
    # Not under pytest's basetemp (reset to 0700 each session): a server running as nobody reads some of these.
    directory = Path(tempfile.mkdtemp(prefix=f"hw-{prefix}-"))
    directory.chmod(0o755)
    return directory


@dataclass
class Project:
    """The catalogue's project: one database, a capture role, a config file and its log."""

    server: EmbeddedPostgres
    db: str
    role: str
    source: str
    directory: Path
    names: NameFactory
    before: dict[tuple[str, int], list[tuple[int, bytes | None, bytes | None]]] = field(default_factory=dict)

    @property
    def config(self) -> Path:
        return self.directory / "headwater.yaml"

    @property
    def home(self) -> Path:
        return self.directory / ".headwater"

    def dsn(self, password: str = f"${{{PW_VAR}}}", *, port: int | None = None, db: str | None = None) -> str:
        return f"postgresql://{self.role}:{password}@127.0.0.1:{port or self.server.port}/{db or self.db}"

    def sql(self, statement: str | sql.Composable, params: tuple[object, ...] = (), *, db: str | None = None) -> list:
        with psycopg.connect(self.server.dsn(db or self.db), autocommit=True) as conn:
            cur = conn.execute(statement, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description is not None else []

    def headwater(
        self, *args: str, config: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "headwater", "--config", str(config or self.config), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env={**os.environ, PW_VAR: PASSWORD, **(env or {})},
        )

    def raw(self) -> dict[str, Any]:
        return yaml.safe_load(self.config.read_text())

    def variant(self, name: str, change: Callable[[dict[str, Any]], None]) -> Path:
        """A copy of the config (same home, so the same log) with ``change`` applied to it."""
        data = self.raw()
        data["home"] = str(self.home)
        change(data)
        directory = self.directory / "variants" / name
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "headwater.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def topic(self, table: str) -> str:
        return f"{self.source}.public.{table}"

    def records(self, home: Path | None = None) -> dict[tuple[str, int], list[tuple[int, bytes | None, bytes | None]]]:
        """Every record of the source's topics: (topic, partition) -> [(offset, key, value)]."""
        config = load_config(self.config, strict_env=False)
        if home is not None:
            config = config.model_copy(update={"home": home})
        log = open_log(config)
        try:
            out = {}
            for topic in log.list_topics():
                if not topic.startswith(f"{self.source}."):
                    continue
                for partition, records in harness_topics.topic_records(log, topic).items():
                    out[(topic, partition)] = [(r.offset, r.key, r.value) for r in records]
            return out
        finally:
            log.close()

    def assert_nothing_lost(self) -> None:
        """Every record captured before the cases is still in the log, at its offset."""
        now = self.records()
        for where, rows in self.before.items():
            assert now.get(where, [])[: len(rows)] == rows, f"records of {where} changed"


def assert_one_line_error(result: subprocess.CompletedProcess[str], *expect: str, secrets: tuple[str, ...] = ()) -> str:
    """Non-zero exit, one ``error:`` line on stderr naming ``expect``, no password anywhere."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    line = lines[0]
    assert line.startswith("error: ") and len(line) > len("error: ")
    for word in expect:
        assert word in line, f"{word!r} missing from: {line}"
    for secret in (PASSWORD, *secrets):
        assert secret not in result.stdout + result.stderr
    return line


@pytest.fixture(scope="module")
def project(pg_server: EmbeddedPostgres) -> Iterator[Project]:
    names = NameFactory(__name__)
    db, role, source = names("bad"), names("cap"), names("shop")
    pg_server.create_database(db)
    directory = private_dir("bad-input")
    shop = Project(pg_server, db, role, source, directory, names)
    shop.sql(
        sql.SQL("CREATE ROLE {} WITH LOGIN REPLICATION PASSWORD {}").format(sql.Identifier(role), sql.Literal(PASSWORD))
    )
    shop.sql("CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, n int)")
    shop.sql("CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL)")
    shop.sql("CREATE TABLE other (id int PRIMARY KEY)")
    shop.sql("CREATE TABLE nokey (a int)")
    shop.sql(f"INSERT INTO customers SELECT g, 'customer ' || g, g * 10 FROM generate_series(1, {CUSTOMERS}) g")
    shop.sql("INSERT INTO items SELECT g, g FROM generate_series(1, 5) g")
    shop.sql(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(sql.Identifier(role)))
    # A least-privilege role cannot create a publication for tables it does not own.
    shop.sql(f"CREATE PUBLICATION headwater_{source} FOR TABLE customers, items")
    shop.config.write_text(
        yaml.safe_dump({"project": "catalogue", "log": {"partitions": 1, "file": {"segment_bytes": 256}}})
    )
    added = shop.headwater(
        "source", "add", source, "--dsn", shop.dsn(), "--tables", "public.customers,public.items", "--yes"
    )
    assert added.returncode == 0, added.stderr
    captured = shop.headwater("capture", "--until-caught-up")
    assert captured.returncode == 0, captured.stderr[-3000:]
    for round_ in range(3):  # one batch per capture run; a batch past 256 B (compressed) rolls
        for i in range(4 * round_ + 1, 4 * round_ + 5):
            shop.sql("UPDATE customers SET n = n + 1 WHERE id = %s", (i,))
        streamed = shop.headwater("capture", "--until-caught-up")
        assert streamed.returncode == 0, streamed.stderr[-3000:]
    shop.before = shop.records()
    assert len(shop.before[(shop.topic("customers"), 0)]) == CUSTOMERS + 12
    try:
        yield shop
    finally:
        for (slot,) in shop.sql("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (db,)):
            shop.sql("SELECT pg_drop_replication_slot(%s)", (slot,))
        pg_server.drop_database(db)
        pg_server.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def replica_server() -> Iterator[EmbeddedPostgres]:
    """A second, small server with wal_level=replica: logical decoding is impossible there."""
    from harness.postgres import start_pg_server

    server, stop = start_pg_server(settings={"wal_level": "replica", "max_wal_senders": "4"})
    try:
        yield server
    finally:
        stop()


# -- the catalogue: each case runs one command and returns its result and the words its line must hold --------

Outcome = tuple[subprocess.CompletedProcess[str], tuple[str, ...]]


def add_source(p: Project, name: str, dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return p.headwater("source", "add", name, "--dsn", dsn, *args, "--yes")


def case_bad_dsn(p: Project) -> Outcome:
    result = add_source(p, p.names("s"), f"host=127.0.0.1 password={PASSWORD} garbage", "--tables", "public.other")
    return result, ("invalid DSN", "write it as postgresql://")


def case_wrong_password(p: Project) -> Outcome:
    result = add_source(p, p.names("s"), p.dsn("Wrong-Pw-1x"), "--tables", "public.other")
    return result, ("password authentication failed", "check the user and password")


def case_unreachable_host(p: Project) -> Outcome:
    port = free_port()
    result = add_source(p, p.names("s"), p.dsn(port=port), "--tables", "public.other")
    return result, (f"cannot reach PostgreSQL at 127.0.0.1:{port}", "check the host and port")


def case_missing_database(p: Project) -> Outcome:
    result = add_source(p, p.names("s"), p.dsn(db="no_such_db"), "--tables", "public.other")
    return result, ("no_such_db", "does not exist", "create it")


def case_no_replication_privilege(p: Project) -> Outcome:
    weak = p.names("weak")
    p.sql(sql.SQL("CREATE ROLE {} WITH LOGIN PASSWORD {}").format(sql.Identifier(weak), sql.Literal(PASSWORD)))
    p.sql(sql.SQL("GRANT SELECT ON public.other TO {}").format(sql.Identifier(weak)))
    dsn = f"postgresql://{weak}:${{{PW_VAR}}}@127.0.0.1:{p.server.port}/{p.db}"
    result = add_source(p, p.names("s"), dsn, "--tables", "public.other")
    return result, (f"role {weak} lacks the REPLICATION attribute", f'ALTER ROLE "{weak}" WITH REPLICATION')


def case_missing_table(p: Project) -> Outcome:
    result = add_source(p, p.names("s"), p.dsn(), "--tables", "public.nope")
    return result, (f"table public.nope does not exist in database {p.db}",)


def case_table_without_key(p: Project) -> Outcome:
    result = add_source(p, p.names("s"), p.dsn(), "--tables", "public.nokey")
    return result, ("public.nokey has no primary key", 'ALTER TABLE "public"."nokey" REPLICA IDENTITY FULL')


def case_slot_name_taken(p: Project) -> Outcome:
    # The captured source's own slot: taking it over would lose its unread changes.
    result = add_source(p, p.names("s"), p.dsn(), "--tables", "public.other", "--slot", f"headwater_{p.source}")
    return result, (f"replication slot headwater_{p.source} already exists", "--slot NAME")


def case_publication_with_other_tables(p: Project) -> Outcome:
    publication = f"headwater_{p.source}"
    result = add_source(p, p.names("s"), p.dsn(), "--tables", "public.other", "--publication", publication)
    return result, (f"publication {publication} already exists with tables", "not tables public.other")


def case_source_name_taken(p: Project) -> Outcome:
    result = add_source(p, p.source, p.dsn(), "--tables", "public.other")
    return result, (p.source, "already")


def case_capture_wrong_password(p: Project) -> Outcome:
    result = p.headwater("capture", "--until-caught-up", env={PW_VAR: "Wrong-Pw-2y"})
    return result, ("password authentication failed", "check the user and password")


def case_capture_unreachable(p: Project) -> Outcome:
    port = free_port()
    config = p.variant("unreachable", lambda d: d["sources"][p.source].update(dsn=p.dsn(port=port)))
    return p.headwater("capture", "--until-caught-up", config=config), (f"127.0.0.1:{port}",)


def case_capture_bad_dsn(p: Project) -> Outcome:
    dsn = f"host=127.0.0.1 password=${{{PW_VAR}}} garbage"
    config = p.variant("bad_dsn", lambda d: d["sources"][p.source].update(dsn=dsn))
    return p.headwater("capture", "--until-caught-up", config=config), ("invalid DSN",)


def case_capture_unknown_source(p: Project) -> Outcome:
    return p.headwater("capture", "nosuch", "--until-caught-up"), ("no source named 'nosuch'", "headwater source list")


def case_capture_slot_dropped(p: Project) -> Outcome:
    # Another source whose slot vanished after its snapshot: capture must not silently re-snapshot or skip.
    name = p.names("gone")
    config = p.variant("gone", lambda d: None)
    p.sql(f"CREATE PUBLICATION headwater_{name} FOR TABLE other")
    assert (
        p.headwater(
            "source", "add", name, "--dsn", p.dsn(), "--tables", "public.other", "--yes", config=config
        ).returncode
        == 0
    )
    assert p.headwater("capture", name, "--until-caught-up", config=config).returncode == 0
    p.sql("SELECT pg_drop_replication_slot(%s)", (f"headwater_{name}",))
    return p.headwater("capture", name, "--until-caught-up", config=config), (f"headwater_{name}", "is gone", "resync")


def case_reserved_topic_name(p: Project) -> Outcome:
    config = p.variant(
        "reserved",
        lambda d: d.update(
            feeds={"__consumer_offsets": {"from": p.topic("customers"), "sql": "SELECT id FROM source", "key": ["id"]}}
        ),
    )
    return p.headwater("feeds", "run", "--available-now", config=config), ("__consumer_offsets", "reserved")


def case_log_tail_unknown_topic(p: Project) -> Outcome:
    return p.headwater("log", "tail", "no.such.topic", "--from-beginning"), (
        "'no.such.topic' does not exist",
        "log topics",
    )


def case_corrupted_segment(p: Project) -> Outcome:
    home = p.directory / "corrupt-home"
    shutil.copytree(p.home / "log", home / "log")
    segments = sorted((home / "log" / p.topic("customers") / "0").glob("*.log"))
    assert len(segments) >= 3, segments
    damaged = bytearray(segments[0].read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # one flipped byte inside a closed segment
    segments[0].write_bytes(damaged)
    config = p.variant("corrupt", lambda d: d.update(home=str(home)))
    result = p.headwater("log", "tail", p.topic("customers"), "--from-beginning", "--limit", "1000", config=config)
    assert segments[0].read_bytes() == damaged  # the damaged file is reported, never "repaired" away
    return result, ("corrupt log segment", segments[0].name, "restore the file from a backup")


def case_truncated_segment(p: Project) -> Outcome:
    home = p.directory / "truncated-home"
    shutil.copytree(p.home / "log", home / "log")
    segments = sorted((home / "log" / p.topic("customers") / "0").glob("*.log"))
    size = segments[1].stat().st_size
    os.truncate(segments[1], size - 7)  # a closed segment cut short: not a torn tail, acknowledged data is missing
    config = p.variant("truncated", lambda d: d.update(home=str(home)))
    result = p.headwater("log", "tail", p.topic("customers"), "--from-beginning", "--limit", "1000", config=config)
    assert segments[1].stat().st_size == size - 7
    return result, ("corrupt log segment", segments[1].name, "restore the file from a backup")


def split_copy(p: Project, name: str) -> Path:
    """A config whose home holds a copy of the project's log, its customers topic split (0 -> 1, 2)."""
    home = p.directory / f"{name}-home"
    shutil.copytree(p.home / "log", home / "log")
    config = p.variant(name, lambda d: d.update(home=str(home)))
    assert p.headwater("log", "split", p.topic("customers"), "0", config=config).returncode == 0
    return config


def case_split_sealed_partition(p: Project) -> Outcome:
    config = split_copy(p, "split-sealed")
    return p.headwater("log", "split", p.topic("customers"), "0", config=config), (
        "is sealed",
        "open descendants [1, 2]",
    )


def case_merge_not_adjacent(p: Project) -> Outcome:
    config = split_copy(p, "merge-apart")
    assert p.headwater("log", "split", p.topic("customers"), "1", config=config).returncode == 0  # 1 -> 3, 4
    return p.headwater("log", "merge", p.topic("customers"), "3", "2", config=config), (
        "are not adjacent",
        "merge neighbours",
    )


def case_split_unknown_partition(p: Project) -> Outcome:
    return p.headwater("log", "split", p.topic("customers"), "5"), ("has partitions 0..0, not 5",)


def case_split_on_kafka(p: Project) -> Outcome:
    config = p.variant(
        "kafka-split", lambda d: d.update(log={"backend": "kafka", "kafka": {"bootstrap_servers": "127.0.0.1:1"}})
    )
    return p.headwater("log", "split", p.topic("customers"), "0", config=config), (
        "Kafka can only add partitions",
        "KIP-253",
    )


def feed_variant(p: Project, name: str, feed: dict[str, Any]) -> Path:
    return p.variant(name, lambda d: d.update(feeds={name: {"from": p.topic("customers"), **feed}}))


def case_feed_sql_error(p: Project) -> Outcome:
    config = feed_variant(p, "bad_sql", {"sql": "SELEC id FROM source", "key": ["id"]})
    return p.headwater("feeds", "run", "--available-now", config=config), ("bad_sql", "sql")


def case_feed_unknown_column(p: Project) -> Outcome:
    config = feed_variant(p, "bad_column", {"sql": "SELECT id, emial FROM source", "key": ["id"]})
    return p.headwater("feeds", "run", "--available-now", config=config), ("bad_column", "emial")


def case_feed_key_not_in_output(p: Project) -> Outcome:
    config = feed_variant(p, "bad_key", {"sql": "SELECT name FROM source", "key": ["id"]})
    return p.headwater("feeds", "run", "--available-now", config=config), ("bad_key", "id")


def case_feed_unknown_input(p: Project) -> Outcome:
    config = p.variant(
        "no_input",
        lambda d: d.update(
            feeds={"no_input": {"from": "shop.public.nope", "sql": "SELECT id FROM source", "key": ["id"]}}
        ),
    )
    return p.headwater("feeds", "run", "--available-now", config=config), ("feeds.no_input.from", "shop.public.nope")


def case_expectation_unknown_column(p: Project) -> Outcome:
    expectation = {"expect": "expect_column_values_to_not_be_null", "column": "emial", "action": "drop"}
    config = feed_variant(
        p, "bad_expect", {"sql": "SELECT id, name FROM source", "key": ["id"], "expectations": [expectation]}
    )
    return p.headwater("feeds", "run", "--available-now", config=config), ("bad_expect", "emial")


def case_unknown_expectation(p: Project) -> Outcome:
    expectation = {"expect": "expect_column_values_to_be_awesome", "column": "name", "action": "warn"}
    config = feed_variant(
        p, "bad_gx", {"sql": "SELECT id, name FROM source", "key": ["id"], "expectations": [expectation]}
    )
    return p.headwater("feeds", "run", "--available-now", config=config), ("expect_column_values_to_be_awesome",)


def case_load_unknown_table(p: Project) -> Outcome:
    return p.headwater("load", "nosuch", "--available-now"), ("nosuch",)


def case_query_sql_error(p: Project) -> Outcome:
    return p.headwater("query", "SELEC 1"), ("SELEC",)


def case_query_unknown_table(p: Project) -> Outcome:
    return p.headwater("query", "SELECT * FROM nosuch_table"), ("nosuch_table",)


def case_incompatible_schema_change(p: Project) -> Outcome:
    from deltalake import DeltaTable

    config = p.variant("scd1", lambda d: d.update(warehouse={"tables": {"items_now": {"from": p.topic("items")}}}))
    first = p.headwater("load", "--available-now", config=config)
    assert first.returncode == 0, first.stderr[-3000:]
    path = p.home / "warehouse" / "items_now"
    version, rows = DeltaTable(str(path)).version(), DeltaTable(str(path)).to_pyarrow_table().num_rows
    p.sql("ALTER TABLE items ALTER COLUMN qty TYPE text USING qty::text")
    p.sql("UPDATE items SET qty = 'a dozen' WHERE id = 1")
    captured = p.headwater("capture", "--until-caught-up")
    assert captured.returncode == 0, captured.stderr[-3000:]
    result = p.headwater("load", "--available-now", config=config)
    assert DeltaTable(str(path)).version() == version  # nothing written
    assert DeltaTable(str(path)).to_pyarrow_table().num_rows == rows
    return result, ("items_now", "qty", "reprocess")


def case_wal_level_not_logical(p: Project, replica: EmbeddedPostgres) -> Outcome:
    db = p.names("replica")
    replica.create_database(db)
    replica.execute("CREATE TABLE t (id int PRIMARY KEY)", dbname=db)
    dsn = f"postgresql://postgres:{replica.password}@127.0.0.1:{replica.port}/{db}"
    result = add_source(p, p.names("s"), dsn, "--tables", "public.t")
    return result, ("wal_level is replica", "set wal_level = logical", "restart")


CASES = [
    pytest.param(case, id=case.__name__.removeprefix("case_").replace("_", "-"))
    for case in (
        case_bad_dsn,
        case_wrong_password,
        case_unreachable_host,
        case_missing_database,
        case_no_replication_privilege,
        case_missing_table,
        case_table_without_key,
        case_slot_name_taken,
        case_publication_with_other_tables,
        case_source_name_taken,
        case_capture_wrong_password,
        case_capture_unreachable,
        case_capture_bad_dsn,
        case_capture_unknown_source,
        case_capture_slot_dropped,
        case_reserved_topic_name,
        case_log_tail_unknown_topic,
        case_corrupted_segment,
        case_truncated_segment,
        case_split_sealed_partition,
        case_merge_not_adjacent,
        case_split_unknown_partition,
        case_split_on_kafka,
        case_feed_sql_error,
        case_feed_unknown_column,
        case_feed_key_not_in_output,
        case_feed_unknown_input,
        case_expectation_unknown_column,
        case_unknown_expectation,
        case_load_unknown_table,
        case_query_sql_error,
        case_query_unknown_table,
        case_incompatible_schema_change,
    )
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input(case: Callable[[Project], Outcome], project: Project) -> None:
    config_before = project.config.read_text()
    result, expect = case(project)
    assert_one_line_error(result, *expect, secrets=("Wrong-Pw-1x", "Wrong-Pw-2y"))
    assert project.config.read_text() == config_before  # a failed command never edits the config
    project.assert_nothing_lost()


def test_wal_level_not_logical(project: Project, replica_server: EmbeddedPostgres) -> None:
    config_before = project.config.read_text()
    result, expect = case_wal_level_not_logical(project, replica_server)
    assert_one_line_error(result, *expect, secrets=(replica_server.password,))
    assert project.config.read_text() == config_before
    project.assert_nothing_lost()


# -- data that must be captured, not refused ------------------------------------------------------------------


def capture_new_source(p: Project, tables: list[str], *, db: str | None = None) -> tuple[str, Path]:
    """Register ``tables`` (already created in ``db``) as a new source in its own config and capture them."""
    name = p.names("data")
    config = p.variant(name, lambda d: d.update(sources={}))
    target = db or p.db
    p.sql(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(sql.Identifier(p.role)), db=target)
    p.sql(f"CREATE PUBLICATION headwater_{name} FOR TABLE {', '.join(tables)}", db=target)
    dsn = p.dsn(db=target)
    added = p.headwater(
        "source", "add", name, "--dsn", dsn, "--tables", ",".join(f"public.{t}" for t in tables), "--yes", config=config
    )
    assert added.returncode == 0, added.stderr[-3000:]
    captured = p.headwater("capture", "--until-caught-up", config=config, timeout=600)
    assert captured.returncode == 0, captured.stderr[-3000:]
    assert PASSWORD not in captured.stdout + captured.stderr
    return name, config


def topic_values(p: Project, topic: str) -> list[dict[str, Any]]:
    config = load_config(p.config, strict_env=False)
    log = open_log(config)
    try:
        return harness_topics.topic_values(log, topic)
    finally:
        log.close()


def test_nul_bytes_are_captured_exactly(project: Project) -> None:
    # text cannot hold NUL; json (not jsonb) keeps the escape as written, bytea holds the byte itself.
    project.sql("CREATE TABLE nul_t (id int PRIMARY KEY, j json, b bytea)")
    project.sql("""INSERT INTO nul_t VALUES (1, '{"a": "x\\u0000y"}', '\\x00ff00'::bytea)""")
    name, config = capture_new_source(project, ["nul_t"])
    project.sql("""UPDATE nul_t SET j = '["\\u0000"]', b = '\\x0000'::bytea WHERE id = 1""")
    assert project.headwater("capture", "--until-caught-up", config=config).returncode == 0
    snapshot, update = topic_values(project, f"{name}.public.nul_t")
    assert snapshot["op"] == "r" and update["op"] == "u"
    assert snapshot["after"] == {"id": 1, "j": '{"a": "x\\u0000y"}', "b": "AP8A"}  # base64 of 00 ff 00
    assert update["after"] == {"id": 1, "j": '["\\u0000"]', "b": "AAA="}
    assert orjson.loads(snapshot["after"]["j"]) == {"a": "x\x00y"}


def test_non_utf8_bytes_in_a_sql_ascii_database(project: Project) -> None:
    # Decision: text that is not UTF-8 cannot become a JSON string without changing it, so the change goes
    # to <topic>.quarantine with its raw bytes (hex) and the reason; capture goes on, nothing is altered.
    db = project.names("ascii")
    create = "CREATE DATABASE {} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    project.sql(sql.SQL(create).format(sql.Identifier(db)))
    try:
        project.sql("CREATE TABLE latin (id int PRIMARY KEY, t text)", db=db)
        project.sql("INSERT INTO latin VALUES (1, 'plain'), (2, E'caf\\xe9 \\xff\\xfe')", db=db)
        name, config = capture_new_source(project, ["latin"], db=db)
        project.sql("INSERT INTO latin VALUES (3, E'\\xff'), (4, 'after')", db=db)
        result = project.headwater("capture", "--until-caught-up", config=config)
        assert result.returncode == 0, result.stderr[-3000:]
        topic = f"{name}.public.latin"
        assert sorted(v["after"]["id"] for v in topic_values(project, topic)) == [1, 4]
        bad = topic_values(project, f"{topic}.quarantine")
        assert sorted(v["after_raw"]["t"] for v in bad) == ["636166e920fffe", "ff"]
        assert all("UTF-8" in v["error"] for v in bad)
    finally:
        for (slot,) in project.sql("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (db,)):
            project.sql("SELECT pg_drop_replication_slot(%s)", (slot,))
        project.server.drop_database(db)


def test_huge_value_is_captured_whole(project: Project) -> None:
    # 48 MB in one text value: far above Kafka's 1 MB default, well inside the file log's 2 GiB batch limit,
    # so the file backend stores it whole (a Kafka broker's limit sends it to <topic>.quarantine instead).
    size = 48 * 1024 * 1024
    project.sql("CREATE TABLE huge (id int PRIMARY KEY, body text)")
    project.sql("INSERT INTO huge VALUES (1, 'small')")
    name, config = capture_new_source(project, ["huge"])
    project.sql("INSERT INTO huge SELECT 2, repeat('0123456789abcdef', %s)", (size // 16,))
    project.sql("INSERT INTO huge VALUES (3, 'after')")
    result = project.headwater("capture", "--until-caught-up", config=config, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    values = {v["after"]["id"]: v["after"]["body"] for v in topic_values(project, f"{name}.public.huge")}
    assert set(values) == {1, 2, 3}
    assert len(values[2]) == size and values[2] == "0123456789abcdef" * (size // 16)
    assert values[3] == "after"  # capture went on after it


def test_huge_transaction_is_streamed_and_captured_completely(project: Project) -> None:
    # logical_decoding_work_mem at its 64 kB minimum for the capture role: a transaction of 20k rows is
    # streamed to the agent in pieces while it runs (what a 300k-row transaction does at the default 64 MB).
    rows = 20_000
    project.sql("CREATE TABLE bulk (id int PRIMARY KEY, pad text)")
    project.sql(sql.SQL("ALTER ROLE {} SET logical_decoding_work_mem = '64kB'").format(sql.Identifier(project.role)))
    try:
        name, config = capture_new_source(project, ["bulk"])
        project.sql(f"INSERT INTO bulk SELECT g, repeat('x', 100) FROM generate_series(1, {rows}) g")
        result = project.headwater("capture", "--until-caught-up", config=config, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        streamed = project.sql(
            "SELECT stream_txns, stream_count FROM pg_stat_replication_slots WHERE slot_name = %s",
            (f"headwater_{name}",),
        )
        assert streamed and streamed[0][0] >= 1 and streamed[0][1] > 1, streamed  # it really was streamed
        values = topic_values(project, f"{name}.public.bulk")
        assert len(values) == rows and {v["op"] for v in values} == {"c"}
        assert {v["after"]["id"] for v in values} == set(range(1, rows + 1))
        assert len({v["source"]["txId"] for v in values}) == 1  # one transaction
    finally:
        project.sql(sql.SQL("ALTER ROLE {} RESET logical_decoding_work_mem").format(sql.Identifier(project.role)))


def test_value_too_large_for_kafka_goes_to_quarantine(project: Project, kafka_broker: Any) -> None:
    # A Kafka record batch holds at most max_batch_bytes (16 MiB): a 20 MiB row cannot be stored, so a note
    # of it (op, source sequence, size, reason) goes to <topic>.quarantine and capture goes on.
    size = 20 * 1024 * 1024
    project.sql("CREATE TABLE kbig (id int PRIMARY KEY, body text)")
    project.sql("INSERT INTO kbig VALUES (1, 'small')")
    directory = project.directory / "kafka"
    directory.mkdir()
    config = directory / "headwater.yaml"
    kafka = {"bootstrap_servers": kafka_broker.bootstrap_servers}
    config.write_text(
        yaml.safe_dump({"project": "catalogue_kafka", "log": {"backend": "kafka", "partitions": 1, "kafka": kafka}})
    )
    name = project.names("kbig")
    project.sql(f"CREATE PUBLICATION headwater_{name} FOR TABLE kbig")
    project.sql(sql.SQL("GRANT SELECT ON kbig TO {}").format(sql.Identifier(project.role)))
    added = project.headwater(
        "source", "add", name, "--dsn", project.dsn(), "--tables", "public.kbig", "--yes", config=config
    )
    assert added.returncode == 0, added.stderr[-3000:]
    assert project.headwater("capture", "--until-caught-up", config=config).returncode == 0
    project.sql("INSERT INTO kbig SELECT 2, repeat('0123456789abcdef', %s)", (size // 16,))
    project.sql("INSERT INTO kbig VALUES (3, 'after')")
    result = project.headwater("capture", "--until-caught-up", config=config, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

    log = open_log(load_config(config, strict_env=False))
    try:

        def read_all(topic: str) -> list[Any]:
            return harness_topics.partition_records(log, topic, 0)

        topic = f"{name}.public.kbig"
        assert [orjson.loads(r.value)["after"]["id"] for r in read_all(topic) if r.value] == [1, 3]
        (note,) = read_all(f"{topic}.quarantine")
    finally:
        log.close()
    assert orjson.loads(note.key) == {"id": 2}
    value = orjson.loads(note.value)
    assert value["op"] == "c" and value["value_bytes"] > size and value["source"]["table"] == "kbig"
    assert "larger than the log accepts" in dict(note.headers)["headwater.error"].decode()
