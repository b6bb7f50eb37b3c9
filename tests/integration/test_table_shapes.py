"""Every table shape reaches SCD1 and SCD2 exactly, through the real CLI (issue 15).

Seven shapes in one database, one project, one pipeline: a primary key under REPLICA
IDENTITY DEFAULT, FULL and USING INDEX (a unique index other than the primary key); no
primary key under FULL with a key configured in ``sources.<source>.keys``; a composite
primary key; a table partitioned by a key column (published via its root); a TOASTed
column. Each is loaded as SCD1 and as SCD2, and a feed over the FULL table as SCD1.

A seeded workload (inserts, updates that leave the TOASTed column unchanged, key changes,
across partitions too, deletes, re-inserts of deleted keys, one TRUNCATE of every table)
runs in two rounds with ``headwater run --until-caught-up`` after each: the first run
snapshots, the second streams. After each run, per warehouse table:

* SCD1: its rows equal the source's (one canonical text per row over every column);
* SCD2: its open versions (``__END_AT`` null) equal the source's rows, no key has two open
  versions, no deleted key has one, and each key has as many versions as an audit trigger
  in Postgres recorded (one per row the snapshot read, one per insert or update after it).

A row-count table per (shape, mode) is printed (``-s``) before the assertion. The Kafka
variant runs three shapes (DEFAULT, FULL, composite) through one snapshot and one round.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import yaml
from harness.row_compare import canonical_row, checksum, row_diff
from psycopg import sql

from core.config import ProjectConfig, load_config
from warehouse_loader.load_job import table_path
from warehouse_loader.query import run_query

SEED = int(os.environ.get("HEADWATER_SHAPES_SEED", "20260315"))
MODES = ("scd1", "scd2")
REGIONS = (1, 2, 3)
PAYLOAD = ("amount", "at", "note", "rev")
PAYLOAD_DDL = "amount numeric(12,2), at timestamptz, note text, rev int NOT NULL"
EPOCH = dt.datetime(1995, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Shape:
    """One source table: ``key`` is its row identity (the primary key, or the configured key)."""

    table: str
    description: str
    key: tuple[str, ...]
    ddl: str
    unique: tuple[str, ...] = ()  # other unique columns: fresh values on insert, changed by key changes
    toast: bool = False  # has ``doc text`` stored EXTERNAL (out of line, uncompressed)
    configured_key: bool = False  # no primary key: ``key`` goes to sources.<source>.keys

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.key, *self.unique, *PAYLOAD, *(("doc",) if self.toast else ()))


PK_DEFAULT = Shape(
    "pk_default",
    "primary key, REPLICA IDENTITY DEFAULT",
    ("id",),
    f"CREATE TABLE pk_default (id int PRIMARY KEY, {PAYLOAD_DDL})",
)
PK_FULL = Shape(
    "pk_full",
    "primary key, REPLICA IDENTITY FULL",
    ("id",),
    f"CREATE TABLE pk_full (id int PRIMARY KEY, {PAYLOAD_DDL}); ALTER TABLE pk_full REPLICA IDENTITY FULL",
)
PK_INDEX = Shape(
    "pk_index",
    "primary key, REPLICA IDENTITY USING INDEX on unique (code)",
    ("id",),
    f"CREATE TABLE pk_index (id int PRIMARY KEY, code text NOT NULL, {PAYLOAD_DDL});"
    " CREATE UNIQUE INDEX pk_index_code ON pk_index (code);"
    " ALTER TABLE pk_index REPLICA IDENTITY USING INDEX pk_index_code",
    unique=("code",),
)
NOKEY_FULL = Shape(
    "nokey_full",
    "no primary key, REPLICA IDENTITY FULL, configured key (ref)",
    ("ref",),
    f"CREATE TABLE nokey_full (ref text NOT NULL, {PAYLOAD_DDL}); ALTER TABLE nokey_full REPLICA IDENTITY FULL",
    configured_key=True,
)
PK_COMPOSITE = Shape(
    "pk_composite",
    "composite primary key (region, id)",
    ("region", "id"),
    f"CREATE TABLE pk_composite (region int, id int, {PAYLOAD_DDL}, PRIMARY KEY (region, id))",
)
PARTITIONED = Shape(
    "partitioned",
    "partitioned by list (region), publish_via_partition_root",
    ("region", "id"),
    f"CREATE TABLE partitioned (region int, id int, {PAYLOAD_DDL}, PRIMARY KEY (region, id))"
    " PARTITION BY LIST (region);"
    + "".join(f" CREATE TABLE partitioned_{r} PARTITION OF partitioned FOR VALUES IN ({r});" for r in REGIONS),
)
TOASTED = Shape(
    "toasted",
    "primary key, TOASTed text (EXTERNAL, 5 kB) mostly left unchanged",
    ("id",),
    f"CREATE TABLE toasted (id int PRIMARY KEY, {PAYLOAD_DDL}, doc text);"
    " ALTER TABLE toasted ALTER COLUMN doc SET STORAGE EXTERNAL",
    toast=True,
)
SHAPES = (PK_DEFAULT, PK_FULL, PK_INDEX, NOKEY_FULL, PK_COMPOSITE, PARTITIONED, TOASTED)

#: The feed over the FULL-identity table (loaded as SCD1, compared with this projection).
FEED_FROM = PK_FULL
FEED_COLUMNS = ("id", "amount", "at", "note", "rev")
FEED_SQL = f"SELECT {', '.join(FEED_COLUMNS)} FROM source"

#: One row per insert or update (its new key), per table; the snapshot's rows are counted apart.
AUDIT = """
CREATE TABLE audit (n bigserial PRIMARY KEY, tbl text NOT NULL, key jsonb NOT NULL);
CREATE FUNCTION audit_new() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit (tbl, key)
    SELECT TG_ARGV[0], jsonb_agg(to_jsonb(NEW) -> k ORDER BY o)
    FROM unnest(TG_ARGV[1:TG_NARGS - 1]) WITH ORDINALITY AS u(k, o);
    RETURN NULL;
END $$;
"""


def fresh(column: str, n: int, rng: random.Random) -> Any:
    """A value no row used before (``n`` is unique per call site); ``region`` is one of REGIONS."""
    if column == "region":
        return rng.choice(REGIONS)
    if column == "id":
        return n
    return f"{column[0]}{n:06d}"


class ShapesWorkload:
    """Seeded random changes over every shape; ``live``/``gone`` mirror each table's keys."""

    def __init__(self, conn: psycopg.Connection[Any], shapes: tuple[Shape, ...], seed: int) -> None:
        self.conn = conn
        self.shapes = shapes
        self.rng = random.Random(seed)
        self.live: dict[str, dict[tuple, dict[str, Any]]] = {s.table: {} for s in shapes}
        self.gone: dict[str, set[tuple]] = {s.table: set() for s in shapes}
        self.stats: Counter[tuple[str, str]] = Counter()
        self.n = 0

    def next_n(self) -> int:
        self.n += 1
        return self.n

    def payload(self) -> dict[str, Any]:
        rng = self.rng
        amount = None if rng.random() < 0.1 else Decimal(rng.randint(-(10**9), 10**9)) / 100
        at = None
        if rng.random() < 0.9:
            at = EPOCH + dt.timedelta(microseconds=rng.randint(0, 30 * 365 * 86400 * 10**6))
        note = rng.choice([None, "", "plain", "é ü ∑ 🙂", f"n{rng.random()}"])
        return {"amount": amount, "at": at, "note": note}

    def doc(self) -> str | None:
        roll = self.rng.random()
        if roll < 0.6:
            return self.rng.randbytes(2500).hex()  # 5 kB: TOASTed out of line
        return None if roll < 0.75 else f"short {self.rng.random()}"

    def insert(self, shape: Shape, key: tuple | None = None) -> None:
        n = self.next_n()
        row = dict(zip(shape.key, key, strict=True)) if key else {c: fresh(c, n, self.rng) for c in shape.key}
        row |= {c: fresh(c, n, self.rng) for c in shape.unique} | self.payload() | {"rev": 0}
        if shape.toast:
            row["doc"] = self.doc()
        self.conn.execute(
            sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                sql.Identifier(shape.table),
                sql.SQL(", ").join(map(sql.Identifier, row)),
                sql.SQL(", ").join(sql.Placeholder() * len(row)),
            ),
            list(row.values()),
        )
        new_key = tuple(row[c] for c in shape.key)
        self.live[shape.table][new_key] = {c: row[c] for c in (*shape.key, *shape.unique)}
        self.gone[shape.table].discard(new_key)
        self.stats[shape.table, "reinsert" if key else "insert"] += 1

    def update(self, shape: Shape, key: tuple, values: dict[str, Any]) -> None:
        """``SET values, rev = rev + 1`` (so no update leaves a row as it was)."""
        sets = [sql.SQL("{} = %s").format(sql.Identifier(c)) for c in values]
        sets.append(sql.SQL("rev = rev + 1"))
        self.conn.execute(
            sql.SQL("UPDATE {} SET {} WHERE {}").format(
                sql.Identifier(shape.table), sql.SQL(", ").join(sets), self.where(shape)
            ),
            [*values.values(), *key],
        )

    def where(self, shape: Shape) -> sql.Composable:
        return sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in shape.key)

    def change_key(self, shape: Shape, key: tuple) -> None:
        """New values for the key, a unique column, or both (a new region moves a partitioned row)."""
        groups = [shape.key, *((c,) for c in shape.unique)]
        chosen = [g for g in groups if self.rng.random() < 0.5] or [self.rng.choice(groups)]
        n = self.next_n()
        values = {c: fresh(c, n, self.rng) for g in chosen for c in g}
        self.update(shape, key, values)
        identity = self.live[shape.table].pop(key) | values
        new_key = tuple(identity[c] for c in shape.key)
        self.live[shape.table][new_key] = identity
        if new_key != key:
            self.gone[shape.table].add(key)
            self.stats[shape.table, "key_change"] += 1
            if shape.unique and not set(shape.unique) & set(values):
                self.stats[shape.table, "key_only_change"] += 1  # under USING INDEX: no old key sent
            if "region" in values and values["region"] != key[0]:
                self.stats[shape.table, "region_change"] += 1
        else:
            self.stats[shape.table, "unique_change"] += 1

    def change(self, shape: Shape) -> None:
        rng, live, gone = self.rng, self.live[shape.table], self.gone[shape.table]
        roll = rng.random()
        if not live or roll < 0.3:
            self.insert(shape)
        elif roll < 0.36 and gone:
            self.insert(shape, rng.choice(sorted(gone)))
        elif roll < 0.62:
            self.update(shape, rng.choice(sorted(live)), self.payload())  # a TOASTed doc stays unchanged
            self.stats[shape.table, "update"] += 1
        elif shape.toast and roll < 0.7:
            self.update(shape, rng.choice(sorted(live)), {"doc": self.doc()})
            self.stats[shape.table, "doc_update"] += 1
        elif roll < 0.82:
            self.change_key(shape, rng.choice(sorted(live)))
        else:
            key = rng.choice(sorted(live))
            self.conn.execute(
                sql.SQL("DELETE FROM {} WHERE {}").format(sql.Identifier(shape.table), self.where(shape)), key
            )
            del live[key]
            gone.add(key)
            self.stats[shape.table, "delete"] += 1

    def initial_rows(self, per_shape: int) -> None:
        with self.conn.transaction():
            for shape in self.shapes:
                for _ in range(per_shape):
                    self.insert(shape)

    def transactions(self, count: int) -> None:
        for _ in range(count):
            with self.conn.transaction():
                for _ in range(self.rng.randint(1, 4)):
                    self.change(self.rng.choice(self.shapes))

    def truncate_and_reload(self, reinserts_per_shape: int, inserts_per_shape: int) -> None:
        """One TRUNCATE of every table, then some deleted keys come back and new rows arrive."""
        tables = sql.SQL(", ").join(sql.Identifier(s.table) for s in self.shapes)
        self.conn.execute(sql.SQL("TRUNCATE {}").format(tables))
        for shape in self.shapes:
            self.gone[shape.table] |= set(self.live[shape.table])
            self.live[shape.table].clear()
            self.stats[shape.table, "truncate"] += 1
        with self.conn.transaction():
            for shape in self.shapes:
                gone = sorted(self.gone[shape.table])
                for key in self.rng.sample(gone, min(reinserts_per_shape, len(gone))):
                    self.insert(shape, key)
                for _ in range(inserts_per_shape):
                    self.insert(shape)


# ----------------------------------------------------------------------------- the project


@dataclass
class Outcome:
    """One warehouse table compared with its source."""

    shape: str
    mode: str
    source_rows: int
    warehouse_rows: int
    open_rows: int | None = None
    versions: int | None = None
    expected_versions: int | None = None
    problems: list[str] = field(default_factory=list)


@dataclass
class ShapesProject:
    """The source database, its audit, the ``headwater.yaml`` and the checks."""

    pg_database: Any
    config_path: Path
    config: ProjectConfig
    shapes: tuple[Shape, ...]
    feed: str | None
    workload: ShapesWorkload
    snapshot_keys: dict[str, Counter[tuple]] = field(default_factory=dict)
    snapshot_audit_n: int = 0

    @classmethod
    def create(
        cls, pg_database, name: str, tmp_path: Path, shapes: tuple[Shape, ...], log: dict, *, feed: bool
    ) -> ShapesProject:
        conn = pg_database.connect()
        conn.execute(AUDIT)
        for shape in shapes:
            conn.execute(shape.ddl)
            args = sql.SQL(", ").join(sql.Literal(a) for a in (shape.table, *shape.key))
            conn.execute(
                sql.SQL(
                    "CREATE TRIGGER {} AFTER INSERT OR UPDATE ON {} FOR EACH ROW EXECUTE FUNCTION audit_new({})"
                ).format(sql.Identifier(f"{shape.table}_audit"), sql.Identifier(shape.table), args)
            )
        published = sql.SQL(", ").join(sql.Identifier(s.table) for s in shapes)
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish_via_partition_root = true)").format(
                sql.Identifier(f"headwater_{name}"), published
            )
        )
        topics = {s.table: f"{name}.public.{s.table}" for s in shapes}
        source: dict[str, Any] = {
            "dsn": pg_database.dsn,
            "tables": [f"public.{s.table}" for s in shapes],
            "heartbeat_interval_s": 1,
        }
        configured = {f"public.{s.table}": list(s.key) for s in shapes if s.configured_key}
        if configured:
            source["keys"] = configured
        tables = {f"{s.table}_{mode}": {"from": topics[s.table], "mode": mode} for s in shapes for mode in MODES}
        document: dict[str, Any] = {
            "project": "shapes",
            "home": str(tmp_path / "home"),
            "log": log,
            "sources": {name: source},
            "warehouse": {"tables": tables},
        }
        feed_name = None
        if feed:
            feed_name = f"{name}_feed"  # unique: feed topics share a broker on the kafka backend
            document["feeds"] = {feed_name: {"from": topics[FEED_FROM.table], "sql": FEED_SQL, "key": ["id"]}}
            tables["feed_scd1"] = {"from": feed_name, "mode": "scd1"}
        config_path = tmp_path / "headwater.yaml"
        config_path.write_text(yaml.safe_dump(document, sort_keys=False))
        workload = ShapesWorkload(conn, shapes, SEED)
        return cls(pg_database, config_path, load_config(config_path), shapes, feed_name, workload)

    def __enter__(self) -> ShapesProject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.workload.conn.close()

    def cli(self, *args: str) -> float:
        """Run ``headwater <args>`` as a subprocess; it must exit 0. Returns its wall time."""
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "headwater", "--config", str(self.config_path), *args],
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 0, f"headwater {' '.join(args)} exited {result.returncode}: {result.stderr[-3000:]}"
        return time.monotonic() - started

    def note_snapshot(self) -> None:
        """Before the first capture: the keys the snapshot will read, and where the audit stands."""
        for shape in self.shapes:
            self.snapshot_keys[shape.table] = Counter(self.source_keys(shape))
        self.snapshot_audit_n = self.pg_database.execute("SELECT coalesce(max(n), 0) FROM audit")[0][0]

    # -- reading both sides

    def source_rows(self, table: str, columns: tuple[str, ...]) -> list[tuple]:
        return self.pg_database.execute(
            sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(map(sql.Identifier, columns)), sql.Identifier(table))
        )

    def source_keys(self, shape: Shape) -> list[tuple]:
        return self.source_rows(shape.table, shape.key)

    def warehouse_rows(self, table: str, columns: tuple[str, ...]) -> list[tuple]:
        quoted = ", ".join(f'"{c}"' for c in columns)
        result = run_query(f'SELECT {quoted} FROM "{table}"', {table: table_path(self.config, table)})
        return [tuple(row[c] for c in columns) for row in result.to_pylist()]

    def audited_versions(self, shape: Shape) -> Counter[tuple]:
        """Versions SCD2 must hold per key: the snapshot's rows plus every insert/update after it."""
        rows = self.pg_database.execute(
            "SELECT key FROM audit WHERE tbl = %s AND n > %s", (shape.table, self.snapshot_audit_n)
        )
        return self.snapshot_keys[shape.table] + Counter(tuple(key) for (key,) in rows)

    # -- the checks

    def compare_rows(self, outcome: Outcome, expected: list[tuple], actual: list[tuple], what: str) -> None:
        missing, extra = row_diff(map(canonical_row, expected), map(canonical_row, actual))
        if missing or extra:
            outcome.problems.append(
                f"{what}: {len(missing)} source rows missing, {len(extra)} extra (e.g. missing {missing[:2]}, "
                f"extra {extra[:2]})"
            )
        else:
            assert checksum(map(canonical_row, expected)) == checksum(map(canonical_row, actual))

    def check_scd1(self, shape_name: str, table: str, columns: tuple[str, ...], expected: list[tuple]) -> Outcome:
        actual = self.warehouse_rows(table, columns)
        outcome = Outcome(shape_name, "scd1", len(expected), len(actual))
        self.compare_rows(outcome, expected, actual, "rows")
        return outcome

    def check_scd2(self, shape: Shape, expected: list[tuple]) -> Outcome:
        table = f"{shape.table}_scd2"
        rows = self.warehouse_rows(table, (*shape.columns, "__END_AT"))
        open_rows = [row[:-1] for row in rows if row[-1] is None]
        outcome = Outcome(shape.table, "scd2", len(expected), len(rows), open_rows=len(open_rows))
        self.compare_rows(outcome, expected, open_rows, "open versions")
        width = len(shape.key)
        source_keys = {row[:width] for row in expected}
        open_keys = Counter(row[:width] for row in open_rows)
        doubled = sorted(k for k, n in open_keys.items() if n > 1)
        if doubled:
            outcome.problems.append(f"{len(doubled)} keys with more than one open version (e.g. {doubled[:3]})")
        deleted = sorted(set(open_keys) - source_keys)
        if deleted:
            outcome.problems.append(
                f"{len(deleted)} keys gone from the source have an open version (e.g. {deleted[:3]})"
            )
        versions = Counter(row[:width] for row in rows)
        audited = self.audited_versions(shape)
        outcome.versions, outcome.expected_versions = versions.total(), audited.total()
        wrong = sorted(k for k in versions.keys() | audited.keys() if versions[k] != audited[k])
        if wrong:
            sample = [(k, versions[k], audited[k]) for k in wrong[:3]]
            outcome.problems.append(f"{len(wrong)} keys with a wrong number of versions (key, have, audited): {sample}")
        return outcome

    def check(self) -> list[Outcome]:
        outcomes = []
        for shape in self.shapes:
            expected = self.source_rows(shape.table, shape.columns)
            outcomes.append(self.check_scd1(shape.table, f"{shape.table}_scd1", shape.columns, expected))
            outcomes.append(self.check_scd2(shape, expected))
        if self.feed is not None:
            expected = self.source_rows(FEED_FROM.table, FEED_COLUMNS)
            outcomes.append(self.check_scd1(f"feed({FEED_FROM.table})", "feed_scd1", FEED_COLUMNS, expected))
        return outcomes


def outcome_table(title: str, outcomes: list[Outcome]) -> str:
    """The per (shape, mode) row counts, one line each; problems listed below."""
    lines = [
        title,
        f"{'shape':<20} {'mode':<5} {'source':>7} {'warehouse':>10} {'open':>6} {'versions':>9} {'audited':>8}  result",
    ]
    for o in outcomes:
        opened = "-" if o.open_rows is None else str(o.open_rows)
        versions = "-" if o.versions is None else str(o.versions)
        audited = "-" if o.expected_versions is None else str(o.expected_versions)
        result = "ok" if not o.problems else "FAIL"
        lines.append(
            f"{o.shape:<20} {o.mode:<5} {o.source_rows:>7} {o.warehouse_rows:>10} {opened:>6} {versions:>9} "
            f"{audited:>8}  {result}"
        )
    lines.extend(f"  {o.shape} {o.mode}: {p}" for o in outcomes for p in o.problems)
    return "\n".join(lines)


def report(title: str, outcomes: list[Outcome], seconds: float) -> str:
    text = outcome_table(f"{title} ({seconds:.1f} s)", outcomes)
    print(f"\n{text}")
    return text


def failures(reports: list[tuple[str, list[Outcome]]]) -> list[str]:
    return [f"{title}: {o.shape} {o.mode}" for title, outcomes in reports for o in outcomes if o.problems]


def assert_workload_covers_every_case(workload: ShapesWorkload, shapes: tuple[Shape, ...], *, since: Counter) -> None:
    """The streamed part had every kind of change on every shape (else the test proves little)."""
    streamed = workload.stats - since
    for shape in shapes:
        kinds = ["insert", "reinsert", "update", "key_change", "delete", "truncate"]
        kinds += ["unique_change", "key_only_change"] if shape.unique else []
        kinds += ["doc_update"] if shape.toast else []
        kinds += ["region_change"] if "region" in shape.key else []
        assert all(streamed[shape.table, kind] > 0 for kind in kinds), (shape.table, dict(streamed))
        assert len(workload.live[shape.table]) >= 10, (shape.table, len(workload.live[shape.table]))


# ----------------------------------------------------------------------------- tests


def test_every_table_shape_loads_exactly_as_scd1_and_scd2(pg_database, unique_name, tmp_path):
    log = {"partitions": 3, "file": {"fsync": "never"}}
    with ShapesProject.create(pg_database, unique_name("shp"), tmp_path, SHAPES, log, feed=True) as project:
        workload = project.workload
        workload.initial_rows(30)
        workload.transactions(60)
        project.note_snapshot()
        seconds = project.cli("run", "--until-caught-up")  # the snapshot
        reports = [("snapshot run", project.check())]
        tables = [report("file log, after the snapshot run", reports[-1][1], seconds)]

        before = Counter(workload.stats)
        workload.transactions(80)
        workload.truncate_and_reload(reinserts_per_shape=8, inserts_per_shape=8)
        workload.transactions(120)
        assert_workload_covers_every_case(workload, SHAPES, since=before)
        (toasted,) = pg_database.execute(
            "SELECT count(*) FROM toasted WHERE pg_column_size(doc) > 4000 AND pg_column_size(doc) = octet_length(doc)"
        )[0]
        assert toasted > 0, "no uncompressed out-of-line doc values"
        seconds = project.cli("run", "--until-caught-up")  # streaming
        reports.append(("streaming run", project.check()))
        tables.append(report("file log, after the streaming run", reports[-1][1], seconds))
    assert not failures(reports), "\n\n".join(tables)


def test_key_shapes_load_exactly_on_the_kafka_backend(kafka_broker, pg_database, unique_name, tmp_path):
    shapes = (PK_DEFAULT, PK_FULL, PK_COMPOSITE)
    log = {"backend": "kafka", "partitions": 3, "kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers}}
    with ShapesProject.create(pg_database, unique_name("shk"), tmp_path, shapes, log, feed=False) as project:
        workload = project.workload
        workload.initial_rows(30)
        project.note_snapshot()
        project.cli("capture", "--until-caught-up")  # the snapshot (no load: the run below loads it all)
        before = Counter(workload.stats)
        workload.transactions(50)
        workload.truncate_and_reload(reinserts_per_shape=8, inserts_per_shape=8)
        workload.transactions(70)
        assert_workload_covers_every_case(workload, shapes, since=before)
        seconds = project.cli("run", "--until-caught-up")
        outcomes = project.check()
    table = report("kafka log, snapshot + one streamed round", outcomes, seconds)
    assert not failures([("kafka", outcomes)]), table


def test_shape_audit_counts_match_the_pipeline_contract(pg_database):
    """The audit trigger counts one version per insert or update under its new key, none for a delete.

    A check of the test's own yardstick (no pipeline): a key change on a partitioned table that
    moves the row to another partition still counts once, under the new key.
    """
    with pg_database.connect() as conn:
        conn.execute(AUDIT)
        conn.execute(PARTITIONED.ddl)
        conn.execute(
            "CREATE TRIGGER a AFTER INSERT OR UPDATE ON partitioned"
            " FOR EACH ROW EXECUTE FUNCTION audit_new('p', 'region', 'id')"
        )
        conn.execute("INSERT INTO partitioned VALUES (1, 1, 1.50, now(), 'x', 0), (2, 2, NULL, NULL, NULL, 0)")
        conn.execute("UPDATE partitioned SET region = 3, rev = rev + 1 WHERE id = 1")  # moves partition
        conn.execute("UPDATE partitioned SET note = 'y', rev = rev + 1 WHERE id = 2")
        conn.execute("DELETE FROM partitioned WHERE id = 2")
        rows = conn.execute("SELECT tbl, key FROM audit ORDER BY n").fetchall()
    assert [(tbl, tuple(key)) for tbl, key in rows] == [("p", (1, 1)), ("p", (2, 2)), ("p", (3, 1)), ("p", (2, 2))]
