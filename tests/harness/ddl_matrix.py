"""Schema changes on published tables, each on its own table, checked through the real CLI (issue 27).

A :class:`DdlCase` is one table with the same base columns and up to two rounds of DDL; a
:class:`DdlProject` is one database schema holding every case's table, one ``headwater.yaml``
(one source capturing the schema with ``schemas:``, an SCD1 and an SCD2 table per case, and
optionally a feed), an audit trigger per table (one row per insert or update, for SCD2's
version counts) and the checks:

* SCD1: its rows equal the source's on the source's current columns (canonical text and checksum);
* SCD2: its open versions equal the source's rows, no key has two open versions, and each key
  has as many versions as the audit recorded plus one where the DDL changed the row's values
  (a re-read that finds a row unchanged writes no version; a renamed column keeps one history);
* the feed's SCD1 table equals its SQL over the source.

:class:`Writer` updates random rows of every table from a thread while the pipeline runs.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg import sql

from core.config import ProjectConfig, load_config
from harness.row_compare import canonical_row, checksum, row_diff
from warehouse_loader.duckdb_connection import duckdb_connection
from warehouse_loader.formats import format_of
from warehouse_loader.load_job import table_path

BASE_COLUMNS = (
    "id int PRIMARY KEY, qty int, price numeric(8,2), name varchar(10), ratio real, note text, rev int NOT NULL"
)
#: The audit lives in a schema of its own, which is not captured.
AUDIT = """
CREATE SCHEMA {audit};
CREATE TABLE {audit}.audit (n bigserial PRIMARY KEY, tbl text NOT NULL, id bigint NOT NULL);
CREATE FUNCTION {audit}.audit_new() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Through jsonb: the column's type may change (int -> bigint), a plan over NEW.id would not follow.
    INSERT INTO {audit}.audit (tbl, id) VALUES (TG_ARGV[0], (to_jsonb(NEW) ->> 'id')::bigint);
    RETURN NULL;
END $$;
"""


@dataclass
class DdlCase:
    """One table and its DDL by round (None: nothing that round).

    ``changes_values``: rounds whose DDL changes the stored values of rows that existed then
    (SCD2 gets a version for each such row that no change touched before the re-read).
    ``renames``: the table's name after each round (RENAME TABLE).
    """

    name: str
    rounds: dict[int, str]
    changes_values: frozenset[int] = frozenset()
    create: str | None = None
    renames: dict[int, str] = field(default_factory=dict)
    #: The table's name now (the writer and the checks follow renames).
    current: str = ""
    #: A table created by round ``born`` (a new table in the captured schema): loaded and checked from then on.
    born: int | None = None
    #: Rows the table gets at creation (``born``) or, partitioned, rows per partition.
    rows: int | None = None

    def __post_init__(self) -> None:
        self.current = self.current or self.name


def default_cases() -> list[DdlCase]:
    """The DDL matrix of issue 27, four rounds per table (``schemas:`` and partitions need their own setup)."""
    return [
        DdlCase(
            "add_nullable",
            {1: "ADD COLUMN tag1 text", 2: "ADD COLUMN tag2 int", 3: "ADD COLUMN tag3 date", 4: "ADD COLUMN tag4 text"},
        ),
        DdlCase(
            "add_default",
            {
                1: "ADD COLUMN tag1 text DEFAULT 'x1'",
                2: "ADD COLUMN tag2 int NOT NULL DEFAULT 42",
                3: "ADD COLUMN tag3 timestamptz DEFAULT now()",
                4: "ADD COLUMN tag4 numeric(6,2) DEFAULT 1.5",
            },
            frozenset({1, 2, 3, 4}),
        ),
        DdlCase(
            "add_volatile",
            {
                1: "ADD COLUMN tag1 float8 DEFAULT random()",
                2: "ADD COLUMN tag2 timestamptz DEFAULT clock_timestamp()",
                3: "ADD COLUMN tag3 text DEFAULT md5(random()::text)",
                4: "ADD COLUMN tag4 float8 DEFAULT random()",
            },
            frozenset({1, 2, 3, 4}),
        ),
        DdlCase(
            "drop_column",
            {1: "DROP COLUMN note", 2: "DROP COLUMN price", 3: "DROP COLUMN name", 4: "DROP COLUMN ratio"},
        ),
        DdlCase(
            "rename_column",
            {
                1: "RENAME COLUMN note TO remark",
                2: "RENAME COLUMN qty TO quantity",
                3: "RENAME COLUMN remark TO comment",
                4: "RENAME COLUMN name TO label",
            },
        ),
        DdlCase(
            "widen_int",
            {1: "ALTER COLUMN qty TYPE bigint", 2: "ALTER COLUMN rev TYPE bigint", 3: "ALTER COLUMN id TYPE bigint"},
        ),
        DdlCase(
            "widen_numeric",
            {
                1: "ALTER COLUMN price TYPE numeric(14,4)",
                2: "ALTER COLUMN price TYPE numeric(16,4)",
                3: "ALTER COLUMN price TYPE numeric(18,6)",
            },
        ),
        DdlCase("widen_varchar", {1: "ALTER COLUMN name TYPE varchar(20)", 2: "ALTER COLUMN name TYPE text"}),
        DdlCase("widen_real", {1: "ALTER COLUMN ratio TYPE double precision"}),
        DdlCase(
            "alter_using",
            {
                1: "ALTER COLUMN note TYPE text USING upper(note)",
                2: "ALTER COLUMN price TYPE numeric(8,2) USING price * 2",
                3: "ALTER COLUMN qty TYPE int USING qty + 1",
                4: "ALTER COLUMN name TYPE varchar(10) USING lower(name)",
            },
            frozenset({1, 2, 3, 4}),
        ),
        DdlCase(
            "defaults_nulls",
            {
                1: "ALTER COLUMN qty SET DEFAULT 7, ALTER COLUMN rev DROP NOT NULL",
                2: "ALTER COLUMN qty DROP DEFAULT, ALTER COLUMN rev SET NOT NULL",
                3: "ALTER COLUMN name SET DEFAULT 'dflt', ALTER COLUMN rev DROP NOT NULL",
                4: "ALTER COLUMN name DROP DEFAULT, ALTER COLUMN rev SET NOT NULL",
            },
        ),
        DdlCase(
            "rename_table",
            {r: f"RENAME TO rename_table_{r}" for r in (1, 2, 3, 4)},
            renames={r: f"rename_table_{r}" for r in (1, 2, 3, 4)},
        ),
        DdlCase("truncated", {r: "TRUNCATE" for r in (1, 2, 3, 4)}),
        DdlCase(
            "parts",
            {1: "ATTACH", 2: "DETACH", 3: "ATTACH", 4: "DETACH"},
            create=PARTITIONED,
        ),
        DdlCase("born_1", {1: "CTAS"}, born=1, rows=30),
        DdlCase("born_2", {2: "CREATE"}, born=2, rows=30),
    ]


#: A table partitioned by ``region``: partition 1 takes every row the writer inserts (the default
#: region); partitions 2.. hold the initial rows' other regions. Rounds attach a filled table as a
#: new partition (its rows join the table without a change in the stream) or detach one (rows leave).
PARTITIONED = (
    f"CREATE TABLE {{table}} ({BASE_COLUMNS.replace('id int PRIMARY KEY', 'id int')}, "
    "region int NOT NULL DEFAULT 1, PRIMARY KEY (id, region)) PARTITION BY LIST (region)"
)


class DdlProject:
    """The database schema, ``headwater.yaml`` and checks of a DDL matrix run (see the module docstring)."""

    def __init__(
        self,
        pg_database: Any,
        source: str,
        tmp_path: Path,
        cases: list[DdlCase],
        *,
        schema: str = "ddl",
        log: dict[str, Any] | None = None,
        feed_case: str | None = None,
        table_format: str | None = None,
        rows: int = 40,
        seed: int = 27,
    ) -> None:
        self.pg = pg_database
        self.source = source
        self.schema = schema
        self.cases = {case.name: case for case in cases}
        self.feed_case = feed_case
        #: ``warehouse.format`` (None: the default, Delta).
        self.table_format = table_format
        self.rng = random.Random(seed)
        self.conn = pg_database.connect()
        self.conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        self.audit_schema = f"{schema}_audit"
        self.conn.execute(AUDIT.format(audit=self.audit_schema))
        self.next_id: dict[str, int] = {}
        self.live: dict[str, set[int]] = {}
        #: Per case, (key, round) of every row live at a DDL that changed values, and of those
        #: the writer changed after that DDL (the re-read may come after the change: no version then).
        self.ddl_rows: dict[str, set[tuple[int, int]]] = {case.name: set() for case in cases}
        self.touched: dict[str, set[tuple[int, int]]] = {case.name: set() for case in cases}
        for case in cases:
            self.create_table(case, rows)
        self.conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLES IN SCHEMA {} WITH (publish_via_partition_root = true)").format(
                sql.Identifier(f"headwater_{source}"), sql.Identifier(schema)
            )
        )
        self.born_loaded = False
        self.home = tmp_path / "home"
        self.config_path = tmp_path / "headwater.yaml"
        self.log = log or {"partitions": 2, "file": {"fsync": "never"}}
        self._config: ProjectConfig | None = None
        # The checks' own connection: wait_equal reads every table's source rows, columns and
        # audit each pass, and a connection per statement was a backend started for each. Never
        # prepared: a statement psycopg prepared would fail once a DDL changes its table's columns.
        self.check_conn = pg_database.connect(prepare_threshold=None)
        self.write_config()

    # -- setup

    def table(self, name: str) -> sql.Composable:
        return sql.Identifier(self.schema, name)

    def create_table(self, case: DdlCase, rows: int) -> None:
        if case.born is not None:
            self.next_id[case.name], self.live[case.name] = 1, set()
            return  # created by its round
        statement = case.create or f"CREATE TABLE {{table}} ({BASE_COLUMNS})"
        self.conn.execute(sql.SQL(statement).format(table=self.table(case.name)))  # type: ignore[arg-type]
        if case.create is PARTITIONED:
            for region in (1, 2):
                self.conn.execute(
                    sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES IN ({})").format(
                        self.table(f"{case.name}_{region}"), self.table(case.name), sql.Literal(region)
                    )
                )
        self.conn.execute(
            sql.SQL("CREATE TRIGGER {} AFTER INSERT OR UPDATE ON {} FOR EACH ROW EXECUTE FUNCTION {}({})").format(
                sql.Identifier(f"{case.name}_audit"),
                self.table(case.name),
                sql.Identifier(self.audit_schema, "audit_new"),
                sql.Literal(case.name),
            )
        )
        self.next_id[case.name] = 1
        self.live[case.name] = set()
        with self.conn.transaction():
            for n in range(rows):
                self.insert(case, full=True, region=1 + n % 2 if case.create is PARTITIONED else None)

    def insert(self, case: DdlCase, *, full: bool = False, region: int | None = None) -> None:
        n = self.next_id[case.name]
        self.next_id[case.name] = n + 1
        if full:
            values = {
                "id": n,
                "qty": n * 3,
                "price": f"{n}.{n % 100:02d}",
                "name": f"nm{n}",
                "ratio": n / 7,
                "note": self.rng.choice([None, f"note {n}", "é ü ∑"]),
                "rev": 0,
            }
        else:
            values = {"id": n, "rev": 0}
        if region is not None:
            values["region"] = region
        self.conn.execute(
            sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                self.table(case.current),
                sql.SQL(", ").join(map(sql.Identifier, values)),
                sql.SQL(", ").join(sql.Placeholder() * len(values)),
            ),
            list(values.values()),
        )
        self.live[case.name].add(n)

    def write_config(self, *, extra_tables: dict[str, dict[str, str]] | None = None) -> None:
        tables: dict[str, dict[str, str]] = {}
        for case in self.cases.values():
            if case.born is not None and not self.born_loaded:
                continue  # a table not created yet: added to the config (and the pipeline restarted) later
            for mode in ("scd1", "scd2"):
                tables[f"{case.name}_{mode}"] = {"from": self.topic(case), "mode": mode}
        tables.update(extra_tables or {})
        document: dict[str, Any] = {
            "project": "ddl",
            "home": str(self.home),
            "log": self.log,
            "sources": {self.source: {"dsn": self.pg.dsn, "schemas": [self.schema], "heartbeat_interval_s": 1}},
            "warehouse": {"tables": tables},
        }
        if self.table_format is not None:
            document["warehouse"]["format"] = self.table_format
        if self.feed_case is not None:
            feed = f"{self.source}_feed"
            document["feeds"] = {
                feed: {"from": self.topic(self.cases[self.feed_case]), "sql": "SELECT * FROM source", "key": ["id"]}
            }
            tables["feed_scd1"] = {"from": feed, "mode": "scd1"}
        self.config_path.write_text(yaml.safe_dump(document, sort_keys=False))
        self._config = None

    @property
    def config(self) -> ProjectConfig:
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config

    def topic(self, case: DdlCase) -> str:
        """A table keeps the topic of the name it was first captured under."""
        return f"{self.source}.{self.schema}.{case.name}"

    def close(self) -> None:
        self.conn.close()
        self.check_conn.close()

    def query(self, statement: str | sql.Composable, params: tuple[Any, ...] | None = None) -> list[tuple[Any, ...]]:
        """One autocommit statement on the checks' connection (each sees what was committed before it)."""
        return self.check_conn.execute(statement, params).fetchall()  # type: ignore[arg-type]

    # -- the CLI

    def cli(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "headwater", "--config", str(self.config_path), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check:
            assert result.returncode == 0, (
                f"headwater {' '.join(args)} exited {result.returncode}: {result.stderr[-3000:]}"
            )
        return result

    def follow(self, log_path: Path) -> subprocess.Popen[bytes]:
        """``headwater run --follow`` in the background (its output to ``log_path``)."""
        out = log_path.open("ab")
        return subprocess.Popen(
            [sys.executable, "-m", "headwater", "--config", str(self.config_path), "run", "--follow"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    # -- changes

    def touch(self, case: DdlCase) -> None:
        """One random change of the table: an update of ``rev``, an insert or a delete."""
        live = self.live[case.name]
        roll = self.rng.random()
        if not live or roll < 0.2:
            self.insert(case)
            return
        key = self.rng.choice(sorted(live))
        self.touched[case.name].update((k, r) for k, r in self.ddl_rows[case.name] if k == key)
        if roll < 0.9:
            self.conn.execute(
                sql.SQL("UPDATE {} SET rev = coalesce(rev, 0) + 1 WHERE id = %s").format(self.table(case.current)),
                (key,),
            )
        else:
            self.conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(self.table(case.current)), (key,))
            live.discard(key)

    def rows_by_id(self, case: DdlCase) -> dict[int, dict[str, Any]]:
        """The table's rows now, by id, each as column -> canonical value."""
        columns = self.source_columns(case)
        return {
            row[columns.index("id")]: {c: canonical_row([v]) for c, v in zip(columns, row, strict=True)}
            for row in self.source_rows(case, columns)
        }

    def apply(self, round_: int, cases: list[DdlCase] | None = None) -> None:
        """Run round ``round_``'s DDL of each case (each in its own transaction)."""
        for case in cases or list(self.cases.values()):
            statement = case.rounds.get(round_)
            if statement is None:
                continue
            before = self.rows_by_id(case) if round_ in case.changes_values else {}
            if statement == "TRUNCATE":
                self.conn.execute(sql.SQL("TRUNCATE {}").format(self.table(case.current)))
                self.live[case.name].clear()
            elif statement in ("ATTACH", "DETACH"):
                self.partition(case, round_, attach=statement == "ATTACH")
            elif statement in ("CTAS", "CREATE"):
                self.born(case, ctas=statement == "CTAS")
            else:
                self.conn.execute(sql.SQL("ALTER TABLE {} ").format(self.table(case.current)) + sql.SQL(statement))
            if round_ in case.changes_values:
                # Each row whose values the DDL changed holds a value the stream never carried: one more
                # SCD2 version, unless a change reaches the row before the re-read does (then at most one).
                after = self.rows_by_id(case)
                changed = [
                    k
                    for k, row in after.items()
                    if k in before and row != {c: before[k].get(c, "(None,)") for c in row}
                ]
                self.ddl_rows[case.name].update((key, round_) for key in changed)
                self.touched[case.name] = {k for k in self.touched[case.name] if k[1] != round_}
            if round_ in case.renames:
                case.current = case.renames[round_]

    def partition(self, case: DdlCase, round_: int, *, attach: bool) -> None:
        """Attach a filled table as partition ``10 + round`` (its rows join), or detach the last one (rows leave)."""
        if attach:
            region = 10 + round_
            name = f"{case.name}_{region}"
            self.conn.execute(sql.SQL("CREATE TABLE {} (LIKE {})").format(self.table(name), self.table(case.name)))
            ids = range(self.next_id[case.name], self.next_id[case.name] + 8)
            self.next_id[case.name] += 8
            with self.conn.transaction():
                for n in ids:
                    self.conn.execute(
                        sql.SQL("INSERT INTO {} (id, qty, note, rev, region) VALUES (%s, %s, %s, 0, %s)").format(
                            self.table(name)
                        ),
                        (n, n, f"attached {n}", region),
                    )
            self.conn.execute(
                sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES IN ({})").format(
                    self.table(case.name), self.table(name), sql.Literal(region)
                )
            )
            self.live[case.name].update(ids)
            # Rows new to the table with no change in the stream: each gets one version (the re-read's).
            self.ddl_rows[case.name].update((n, round_) for n in ids)
            return
        regions = {2: 2, 4: 13}
        region = regions[round_]
        self.conn.execute(
            sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(
                self.table(case.name), self.table(f"{case.name}_{region}")
            )
        )
        gone = {
            row[0] for row in self.pg.execute(sql.SQL("SELECT id FROM {}").format(self.table(f"{case.name}_{region}")))
        }
        self.live[case.name] -= gone

    def born(self, case: DdlCase, *, ctas: bool) -> None:
        """Create the case's table in the captured schema with rows: by CREATE TABLE AS, or CREATE then INSERTs."""
        rows = case.rows or 0
        first = self.next_id[case.name]
        ids = range(first, first + rows)
        self.next_id[case.name] += rows
        table = self.table(case.name)
        if ctas:
            self.conn.execute(
                sql.SQL(
                    "CREATE TABLE {} AS SELECT g AS id, g * 3 AS qty, (g || '.50')::numeric(8,2) AS price, "
                    "('nm' || g)::varchar(10) AS name, (g / 7.0)::real AS ratio, 'born ' || g AS note, 0 AS rev "
                    "FROM generate_series(%s::int, %s::int) g"
                ).format(table),
                (first, first + rows - 1),
            )
            self.conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(table))
        else:
            self.conn.execute(sql.SQL(f"CREATE TABLE {{}} ({BASE_COLUMNS})").format(table))
        self.conn.execute(
            sql.SQL("CREATE TRIGGER {} AFTER INSERT OR UPDATE ON {} FOR EACH ROW EXECUTE FUNCTION {}({})").format(
                sql.Identifier(f"{case.name}_audit"),
                table,
                sql.Identifier(self.audit_schema, "audit_new"),
                sql.Literal(case.name),
            )
        )
        if ctas:
            self.live[case.name].update(ids)
            self.ddl_rows[case.name].update((n, case.born or 0) for n in ids)  # no trigger saw them: one version each
            return
        self.next_id[case.name] = first
        for _ in ids:
            self.insert(case, full=True)

    def expected_versions(self, case: DdlCase) -> tuple[Counter[int], Counter[int]]:
        """Versions each key must have, and how many fewer it may have (one per DDL a change reached first)."""
        want = self.audited(case)
        uncertain: Counter[int] = Counter()
        for key, round_ in self.ddl_rows[case.name]:
            want[key] += 1
            if (key, round_) in self.touched[case.name]:
                uncertain[key] += 1
        return want, uncertain

    # -- the checks

    def source_columns(self, case: DdlCase) -> list[str]:
        rows = self.query(
            "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0 "
            "AND NOT a.attisdropped ORDER BY a.attnum",
            (f'"{self.schema}"."{case.current}"',),
        )
        return [r[0] for r in rows]

    def source_rows(self, case: DdlCase, columns: list[str]) -> list[tuple[Any, ...]]:
        # A real is read as the double it widens to exactly (the warehouse holds it as float32;
        # its text would be a shorter decimal than the float's).
        reals = {
            row[0]
            for row in self.query(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND atttypid = 'real'::regtype",
                (f'"{self.schema}"."{case.current}"',),
            )
        }
        selected = [
            sql.SQL("{}::float8").format(sql.Identifier(c)) if c in reals else sql.Identifier(c) for c in columns
        ]
        return self.query(sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(selected), self.table(case.current)))

    def warehouse_rows(self, table: str, columns: list[str]) -> list[tuple[Any, ...]] | None:
        # The table format's own registration into a connection to the process's shared DuckDB
        # database: `headwater query`'s locked database of its own costs ~10 ms CPU to open, and
        # these reads are most of what the test process does (~60 a pass).
        quoted = ", ".join(f'"{c}"' for c in columns)
        location = table_path(self.config, table)
        con = duckdb_connection([location])
        try:
            stored = format_of(self.config, table).open(location)
            if stored is None:
                return None  # not loaded yet
            stored.register(con, table)
            result = con.sql(f'SELECT {quoted} FROM "{table}"').to_arrow_table()
        except Exception as exc:  # a column the table does not have (yet)
            return [("query failed", str(exc).splitlines()[0])]
        finally:
            con.close()
        return [tuple(row[c] for c in columns) for row in result.to_pylist()]

    def audited(self, case: DdlCase) -> Counter[int]:
        rows = self.query(
            sql.SQL("SELECT id FROM {} WHERE tbl = %s").format(sql.Identifier(self.audit_schema, "audit")), (case.name,)
        )
        return Counter(row[0] for row in rows)

    def problems(self, case: DdlCase, *, check_versions: bool = True) -> list[str]:
        """What differs between the case's warehouse tables and its source table now ([]: nothing)."""
        columns = self.source_columns(case)
        expected = self.source_rows(case, columns)
        found: list[str] = []
        scd1 = self.warehouse_rows(f"{case.name}_scd1", columns)
        found += compare(f"{case.name}_scd1", expected, scd1)
        scd2 = self.warehouse_rows(f"{case.name}_scd2", [*columns, "__END_AT"])
        if scd2 is not None and scd2 and scd2[0][0] == "query failed":
            found.append(f"{case.name}_scd2: {scd2[0][1]}")
            return found
        opened = None if scd2 is None else [row[:-1] for row in scd2 if row[-1] is None]
        found += compare(f"{case.name}_scd2 open versions", expected, opened)
        if scd2 is not None and check_versions:
            have = Counter(row[0] for row in scd2)
            versions, uncertain = self.expected_versions(case)
            wrong = sorted(
                k for k in have.keys() | versions.keys() if not versions[k] - uncertain[k] <= have[k] <= versions[k]
            )
            if wrong:
                sample = [(k, have[k], versions[k]) for k in wrong[:4]]
                found.append(
                    f"{case.name}_scd2: {len(wrong)} keys with a wrong number of versions (id, have, want): {sample}"
                )
        return found

    def feed_problems(self) -> list[str]:
        if self.feed_case is None:
            return []
        case = self.cases[self.feed_case]
        columns = self.source_columns(case)
        return compare("feed_scd1", self.source_rows(case, columns), self.warehouse_rows("feed_scd1", columns))

    def wait_equal(self, cases: list[DdlCase] | None = None, *, timeout_s: float = 240) -> list[str]:
        """Poll until every case's tables (and the feed) equal the source; the problems left at the timeout."""
        deadline = time.monotonic() + timeout_s
        selected = [c for c in cases or self.cases.values() if c.born is None or self.born_loaded]
        while True:
            by_case = {case.name: self.problems(case) for case in selected}
            found = [p for problems in by_case.values() for p in problems] + self.feed_problems()
            if not found or time.monotonic() > deadline:
                return found
            # Until those are equal only they (and the feed) are read again: each read is a source
            # query and two table reads, and full passes were most of the test process's CPU. A
            # full pass has the last word.
            unequal = [case for case in selected if by_case[case.name]]
            while time.monotonic() <= deadline:
                time.sleep(2)
                if not any(self.problems(case) for case in unequal) and not self.feed_problems():
                    break


def compare(what: str, expected: list[tuple[Any, ...]], actual: list[tuple[Any, ...]] | None) -> list[str]:
    """One line when ``actual`` differs from ``expected`` as multisets of canonical rows."""
    if actual is None:
        return [f"{what}: no table yet"]
    if actual and actual[0] and actual[0][0] == "query failed":
        return [f"{what}: {actual[0][1]}"]
    missing, extra = row_diff(map(canonical_row, expected), map(canonical_row, actual))
    if missing or extra:
        return [
            f"{what}: {len(missing)} source rows missing, {len(extra)} extra "
            f"(e.g. missing {missing[:2]}, extra {extra[:2]})"
        ]
    assert checksum(map(canonical_row, expected)) == checksum(map(canonical_row, actual))
    return []


class Writer:
    """Changes random rows of the given cases' tables from a thread until stopped.

    It writes through the project's setup connection, under :attr:`lock` (the checks have their own).
    """

    def __init__(self, project: DdlProject, cases: list[DdlCase], *, per_second: float = 8) -> None:
        self.project = project
        self.cases = cases
        self.interval = 1 / per_second
        self.stop = threading.Event()
        self.paused = threading.Event()
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            if self.paused.is_set():
                continue
            with self.lock:
                case = self.project.rng.choice([c for c in self.cases if c.born is None])
                try:
                    self.project.touch(case)
                except psycopg.Error as exc:
                    self.errors.append(f"{case.name}: {exc}")

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
