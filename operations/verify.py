"""``headwater verify TABLE``: whether an SCD1 warehouse table still equals its source table.

**The consistent point.** A temporary logical replication slot is created with an exported
snapshot (``CREATE_REPLICATION_SLOT ... TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT``): its
consistent point ``C`` is an exact LSN, and the snapshot sees precisely the transactions
that committed before ``C``, i.e. the changes whose ``(commit_lsn, txn_index)`` sorts below
``Sequence(C, 0)``. The source is read in a ``REPEATABLE READ`` transaction that imports
the snapshot (the slot is gone once it is imported), while capture goes on.

**Loaded past it.** The table is compared once it holds every change below ``C``: the
source's capture slot has acknowledged ``C`` (capture acknowledges only what the log
stored), and the table's loader has committed every offset of its topic that existed
then. When the capture slot is idle, verify runs capture itself until caught up; when
the loader lags, it waits for a running loader or, with ``load=True``, runs one
``availableNow`` load itself (only when no other loader runs). Every wait is bounded by
``timeout_s`` and ends in a one-line :class:`VerifyWaitError`.

**The comparison** (data-diff's way, two levels, each one scan of each side): every row's
key and canonical values (:mod:`operations.row_hashes`) are hashed on both sides, in
Postgres and in DuckDB over the Delta files, and summed per key-hash bucket with a row
count (about 64 rows per bucket). Only the buckets whose count or sum differ are read
again, row by row, and compared per key and column. So the source is scanned about twice
and only the differing buckets travel.

**Rows newer than the snapshot.** A differing key whose warehouse row (``__hw_seq``) or
delete (its tombstone) is at or past ``C`` changed after the snapshot: it is compared
again at a new consistent point, up to ``rounds`` times; a key still changing then is
reported as unsettled, never as a difference.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import duckdb
import orjson
import psycopg
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
from deltalake import DeltaTable
from psycopg import sql

from core.config import ProjectConfig
from core.errors import PermanentError, TransientError
from log.base import Log
from log.factory import open_log
from log.sequence import Lsn
from log.sequence import Sequence as ChangeSequence
from log.table_schemas import read_schema_records
from log.topics import load_group
from operations.row_hashes import Canonical, bucket_sql, canonical_columns, hash60, text_sql
from spark_log.versions import resolve_topic
from warehouse_loader.changes import DELETE_OP, OP, SEQ, TRUNCATE_OP
from warehouse_loader.delta_scan import register_delta
from warehouse_loader.delta_writer import TOMBSTONES_DIR, open_table
from warehouse_loader.errors import WarehouseError
from warehouse_loader.load_job import UnknownWarehouseTableError, load_identity, table_keys, table_path
from warehouse_loader.quality import verify_runs_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Rows per key-hash bucket the first level aims at.
ROWS_PER_BUCKET = 64
#: Differences listed in a result (all are counted).
SHOWN = 50
# Settings of the source connections: canonical texts depend on them (row_hashes).
_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO -c extra_float_digits=1 -c bytea_output=hex -c IntervalStyle=postgres"


class VerifyError(WarehouseError, PermanentError):
    """A table that verify cannot compare (SCD2, loaded from a feed, unknown source)."""


class VerifyWaitError(WarehouseError, TransientError):
    """Capture or the load did not pass the snapshot within the time allowed."""


class TableDiffersError(WarehouseError):
    """The table differs from its source (exit 1: the command worked, the data did not match)."""


@dataclass(frozen=True)
class Difference:
    """One key whose row differs: ``kind`` is ``differs``, ``missing in the warehouse`` or ``only in the warehouse``."""

    key: str
    kind: str
    columns: list[tuple[str, str | None, str | None]] = field(default_factory=list)

    def describe(self) -> str:
        """One line: the key, and what differs (column: source value vs warehouse value)."""
        if self.kind != "differs":
            return f"{self.key}: {self.kind}"
        parts = [f"{name}: source {src!r}, warehouse {wh!r}" for name, src, wh in self.columns]
        return f"{self.key}: " + "; ".join(parts)


@dataclass(frozen=True)
class VerifyResult:
    """What :func:`verify_table` found."""

    table: str
    source_table: str
    lsn: str
    source_rows: int
    warehouse_rows: int
    buckets: int
    differing_buckets: int
    differences: list[Difference]
    unsettled: list[str]
    not_compared: list[str]
    rounds: int
    seconds: float
    #: Seconds of the first round's level-1 scans: ``source`` (Postgres) and ``warehouse`` (DuckDB).
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def equal(self) -> bool:
        """No key differs and none is left unsettled."""
        return not self.differences and not self.unsettled

    def lines(self) -> list[str]:
        """The report, a line each (what ``headwater verify`` prints)."""
        out = [
            f"{self.table}: source {self.source_table} at LSN {self.lsn} (exported snapshot); "
            f"rows: source {self.source_rows:,}, warehouse {self.warehouse_rows:,}; "
            f"{self.differing_buckets} of {self.buckets:,} key buckets differ; "
            f"{self.rounds} round(s), {self.seconds:.1f}s"
        ]
        if self.not_compared:
            out.append(f"not compared (no exact common form): {', '.join(self.not_compared)}")
        out.extend(d.describe() for d in self.differences[:SHOWN])
        if len(self.differences) > SHOWN:
            out.append(f"... and {len(self.differences) - SHOWN} more keys")
        if self.unsettled:
            out.append(f"still changing after {self.rounds} rounds, not verified: {', '.join(self.unsettled[:SHOWN])}")
        out.append(
            "equal"
            if self.equal
            else f"{len(self.differences)} key(s) differ"
            + (f", {len(self.unsettled)} unsettled" if self.unsettled else "")
        )
        return out

    def as_json(self) -> dict[str, Any]:
        """One line of the verify history (:func:`warehouse_loader.quality.verify_runs_path`)."""
        return {
            "table": self.table,
            "run_at": datetime.now(UTC).isoformat(),
            "lsn": self.lsn,
            "equal": self.equal,
            "source_rows": self.source_rows,
            "warehouse_rows": self.warehouse_rows,
            "differences": len(self.differences),
            "keys": [asdict(d) for d in self.differences[:SHOWN]],
            "unsettled": self.unsettled[:SHOWN],
            "not_compared": self.not_compared,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class _Target:
    """The table, its source table and how to read both."""

    name: str
    build: str
    topic: str
    source: str
    slot: str
    dsn: str
    relation: str  # quoted schema.table
    keys: tuple[str, ...]
    key_text: list[Canonical]
    columns: list[Canonical]
    not_compared: list[str]
    sequence_by: str


@dataclass
class _Rows:
    """Rows of one side by key text: canonical column texts, raw key values, warehouse sequence."""

    values: dict[str, tuple[str | None, ...]] = field(default_factory=dict)
    raw_keys: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    seqs: dict[str, Any] = field(default_factory=dict)


def verify_table(
    config: ProjectConfig,
    name: str,
    *,
    timeout_s: float = 60.0,
    load: bool = False,
    rounds: int = 3,
    spark: SparkSession | None = None,
    record: bool = True,
    say: Callable[[str], None] | None = None,
) -> VerifyResult:
    """Compare SCD1 table ``name`` with its source table at a consistent point (see module doc)."""
    started = time.monotonic()
    deadline = started + timeout_s
    log = open_log(config)
    try:
        target = _resolve(config, log, name)
    finally:
        log.close()
    pending: set[str] | None = None  # None: the whole table
    confirmed: dict[str, Difference] = {}
    first: tuple[int, int, int, int] | None = None
    timings: dict[str, float] = {}
    lsn = ""
    done = 0
    for attempt in range(1, rounds + 1):
        done = attempt
        with _Snapshot(target.dsn, timeout_s) as snapshot:
            lsn = str(snapshot.lsn)
            if say:
                say(f"snapshot of {target.relation} at LSN {lsn}; waiting for the table to be loaded past it")
            _wait_loaded(config, target, snapshot.lsn, deadline, load=load, spark=spark)
            delta = DeltaTable(str(table_path(config, name)))
            if pending is None:
                counts, found = _compare_all(snapshot.conn, delta, target, timings)
                first = counts
            else:
                found = _compare_keys(snapshot.conn, delta, target, pending)
        threshold = ChangeSequence(snapshot.lsn.value, 0).sortable()
        side = open_table(table_path(config, name) / TOMBSTONES_DIR)
        newer = _changed_since(delta, side, target, found, threshold)
        for key, difference in found.items():
            if key not in newer:
                confirmed[key] = difference
        pending = {key for key in found if key in newer}
        if not pending:
            break
    assert first is not None
    source_rows, warehouse_rows, buckets, differing = first
    result = VerifyResult(
        table=name,
        source_table=target.relation,
        lsn=lsn,
        source_rows=source_rows,
        warehouse_rows=warehouse_rows,
        buckets=buckets,
        differing_buckets=differing,
        differences=[confirmed[k] for k in sorted(confirmed)],
        unsettled=sorted(_shown(target, key) for key in pending or ()),
        not_compared=target.not_compared,
        rounds=done,
        seconds=time.monotonic() - started,
        timings=timings,
    )
    if record:
        path = verify_runs_path(config)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as handle:
            handle.write(orjson.dumps(result.as_json()) + b"\n")
    return result


# --------------------------------------------------------------------------- the target


def _resolve(config: ProjectConfig, log: Log, name: str) -> _Target:
    settings = config.warehouse.tables.get(name)
    if settings is None:
        known = ", ".join(config.warehouse.tables) or "none"
        msg = f"no warehouse table named {name!r}; known: {known} (see warehouse.tables in headwater.yaml)"
        raise UnknownWarehouseTableError(msg)
    if settings.mode != "scd1":
        msg = f"verify compares SCD1 tables with their source; {name!r} is {settings.mode}"
        raise VerifyError(msg)
    if settings.from_ in config.feeds:
        msg = f"{name!r} is loaded from feed {settings.from_!r}, not from a source table: nothing to compare it with"
        raise VerifyError(msg)
    topic = resolve_topic(config, settings.from_)
    source_name = topic.split(".", 1)[0]
    source = config.sources.get(source_name)
    records = read_schema_records(log, [topic]).get(topic, [])
    if source is None or not records:
        msg = f"{name!r} reads topic {topic!r}, which no configured source has captured; run 'headwater capture' first"
        raise VerifyError(msg)
    path = table_path(config, name)
    delta = open_table(path)
    if delta is None:
        msg = f"table {name!r} is not loaded yet; run 'headwater load {name} --available-now'"
        raise VerifyError(msg)
    latest = max(records, key=lambda record: int(record.get("version", 0)))
    keys = table_keys(config, log, name)
    stored = pa.schema(delta.schema().to_arrow())
    by_name = {c["name"]: c for c in latest["columns"]}
    key_text, _ = canonical_columns([by_name[k] for k in keys], stored, source.types)
    if len(key_text) != len(keys):
        msg = f"{name!r}: its key ({', '.join(keys)}) has a type verify cannot compare exactly"
        raise VerifyError(msg)
    columns, skipped = canonical_columns([c for c in latest["columns"] if c["name"] not in keys], stored, source.types)
    slot = source.slot or f"headwater_{source_name.lower()}"
    relation = f"{_ident(latest['schema'])}.{_ident(latest['table'])}"
    return _Target(
        name=name,
        build=load_identity(config, name)[0],
        topic=topic,
        source=source_name,
        slot=slot,
        dsn=source.dsn.get_secret_value(),
        relation=relation,
        keys=keys,
        key_text=key_text,
        columns=columns,
        not_compared=skipped,
        sequence_by=settings.sequence_by or SEQ,
    )


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# --------------------------------------------------------------------------- the consistent point


class _Snapshot:
    """A temporary slot's exported snapshot, imported into a read-only REPEATABLE READ transaction."""

    def __init__(self, dsn: str, timeout_s: float) -> None:
        self._dsn = dsn
        self._timeout_s = timeout_s
        self.conn: psycopg.Connection[Any]
        self.lsn = Lsn(0)

    def __enter__(self) -> _Snapshot:
        repl = psycopg.connect(self._dsn, autocommit=True, replication="database", options=_OPTIONS)
        # Creating a slot waits for the transactions running then to end: bounded by cancelling it.
        timer = threading.Timer(self._timeout_s, repl.cancel)
        timer.start()
        try:
            slot = f"headwater_verify_{os.getpid()}_{uuid.uuid4().hex[:8]}"
            command = sql.SQL("CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT")
            try:
                row = repl.execute(command.format(sql.Identifier(slot))).fetchone()
            except psycopg.errors.QueryCanceled:
                msg = (
                    f"no consistent snapshot within {self._timeout_s:.0f}s: a transaction stayed open on the source; "
                    "retry later or with a longer --timeout"
                )
                raise VerifyWaitError(msg) from None
            assert row is not None
            self.lsn = Lsn.parse(str(row[1]))
            self.conn = psycopg.connect(self._dsn, options=_OPTIONS)
            self.conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            self.conn.read_only = True
            self.conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(str(row[2]))))
        finally:
            timer.cancel()
            repl.close()  # the temporary slot goes; the imported snapshot stays with the transaction
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


def _wait_loaded(
    config: ProjectConfig, target: _Target, lsn: Lsn, deadline: float, *, load: bool, spark: SparkSession | None
) -> None:
    """Return once the table holds every change before ``lsn`` (see module doc), else raise at ``deadline``."""
    ran_capture = False
    with psycopg.connect(target.dsn, autocommit=True, options=_OPTIONS) as conn:
        while True:
            row = conn.execute(
                "SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                (target.slot,),
            ).fetchone()
            if row is None:
                msg = f"source {target.source} has no replication slot {target.slot}; see 'headwater source resync'"
                raise VerifyError(msg)
            active, confirmed = bool(row[0]), Lsn.parse(row[1]) if row[1] else Lsn(0)
            if confirmed >= lsn or (ran_capture and not active):
                break
            if not active and not ran_capture:
                _capture(config, target.source)
                ran_capture = True
                continue
            if time.monotonic() > deadline:
                msg = (
                    f"capture of source {target.source} acknowledged {confirmed}, not yet the snapshot's LSN {lsn}; "
                    "is its capture stuck? retry, or raise --timeout"
                )
                raise VerifyWaitError(msg)
            time.sleep(0.2)
    log = open_log(config)
    try:
        partitions = log.describe_topic(target.topic).partitions
        ends = {p: log.end_offset(target.topic, p) for p in range(partitions)}
    finally:
        log.close()
    ran_load = False
    while True:
        log = open_log(config)
        try:
            loaded = log.committed(load_group(target.build), target.topic)
        finally:
            log.close()
        behind = {p: (loaded.get(p, 0), end) for p, end in ends.items() if loaded.get(p, 0) < end}
        if not behind:
            return
        if load and not ran_load:
            _load(config, target.name, spark)
            ran_load = True
            continue
        if time.monotonic() > deadline:
            lag = sum(end - at for at, end in behind.values())
            msg = (
                f"warehouse table {target.name} has {lag} record(s) of {target.topic} to load before it passes the "
                f"snapshot at LSN {lsn}; start 'headwater load {target.name} --follow' (or pass --load when no "
                "loader runs) and retry, or raise --timeout"
            )
            raise VerifyWaitError(msg)
        time.sleep(0.5)


def _capture(config: ProjectConfig, source: str) -> None:
    """Bring an idle source's capture up to date (a capture that starts meanwhile holds the slot: fine)."""
    from capture.runner import run_capture  # psycopg replication and the agent: only when capture is idle

    try:
        run_capture(config, (source,), until_caught_up=True)
    except PermanentError:
        raise
    except Exception:  # the slot became active: a capture started meanwhile and will pass the LSN
        return


def _load(config: ProjectConfig, name: str, spark: SparkSession | None) -> None:
    """One ``availableNow`` load of ``name`` (the caller knows no other loader runs)."""
    # pyspark: only when the load must run here
    from warehouse_loader.load_job import run_loads

    if spark is not None:
        log = open_log(config)
        try:
            run_loads(spark, config, log, [name], available_now=True)
        finally:
            log.close()
        return
    from spark_log.job import spark_job

    with spark_job(config, "headwater-verify") as (session, log):
        run_loads(session, config, log, [name], available_now=True)


# --------------------------------------------------------------------------- the comparison


def _bucket_sql(target: _Target, dialect: str, buckets: int) -> tuple[str, str]:
    """(bucket expression, row hash expression) in ``dialect``."""
    row = text_sql([*target.key_text, *target.columns], dialect)
    return bucket_sql(target.key_text, dialect, buckets), hash60(row, dialect)


def _compare_all(
    conn: psycopg.Connection[Any], delta: DeltaTable, target: _Target, timings: dict[str, float]
) -> tuple[tuple[int, int, int, int], dict[str, Difference]]:
    """Level 1 over every row, level 2 over the differing buckets; ``(counts, differences)``.

    ``timings`` gets the seconds of the level-1 scans.
    """
    with _duck(delta) as duck:
        warehouse_rows = int(duck.sql("SELECT count(*) FROM target").fetchall()[0][0])
        buckets = max(1, min(1 << 20, warehouse_rows // ROWS_PER_BUCKET))
        bucket_pg, hash_pg = _bucket_sql(target, "pg", buckets)
        bucket_duck, hash_duck = _bucket_sql(target, "duck", buckets)
        level1 = "SELECT {b} AS b, count(*) AS n, sum({h}) AS s FROM {t} GROUP BY 1"
        # Both sides at once: Postgres scans in its own process, DuckDB without the GIL.
        with ThreadPoolExecutor(1) as pool:
            query = level1.format(b=bucket_pg, h=hash_pg, t=f"ONLY {target.relation}")
            source_rows_future = pool.submit(_fetch, conn, query, timings)
            start = time.perf_counter()
            warehouse = {
                int(b): (int(n), int(s))
                for b, n, s in duck.sql(level1.format(b=bucket_duck, h=hash_duck, t="target")).fetchall()
            }
            timings["warehouse"] = time.perf_counter() - start
            source = {int(b): (int(n), int(s)) for b, n, s in source_rows_future.result()}
        differing = sorted(b for b in source.keys() | warehouse.keys() if source.get(b) != warehouse.get(b))
        source_rows = sum(n for n, _ in source.values())
        if not differing:
            return (source_rows, warehouse_rows, buckets, 0), {}
        in_list = ", ".join(map(str, differing))
        with ThreadPoolExecutor(1) as pool:
            src_future = pool.submit(_source_rows, conn, target, f"{bucket_pg} IN ({in_list})")
            wh = _warehouse_rows(duck, target, f"{bucket_duck} IN ({in_list})")
            src = src_future.result()
    return (source_rows, warehouse_rows, buckets, len(differing)), _diff(target, src, wh)


def _compare_keys(
    conn: psycopg.Connection[Any], delta: DeltaTable, target: _Target, keys: Iterable[str]
) -> dict[str, Difference]:
    """The given keys (key texts) compared again, by key on both sides."""
    wanted = sorted(keys)
    with _duck(delta) as duck:
        duck.register("wanted", pa.table({"k": pa.array(wanted, pa.string())}))
        key_duck = text_sql(target.key_text, "duck")
        wh = _warehouse_rows(duck, target, f"{key_duck} IN (SELECT k FROM wanted)")
    src = _source_rows(conn, target, f"{text_sql(target.key_text, 'pg')} = ANY(%(keys)s)", {"keys": wanted})
    return _diff(target, src, wh, only=set(wanted))


def _fetch(conn: psycopg.Connection[Any], query: str, timings: dict[str, float] | None = None) -> list[tuple[Any, ...]]:
    start = time.perf_counter()
    rows = conn.execute(query).fetchall()  # type: ignore[arg-type]  # built from quoted identifiers
    if timings is not None:
        timings["source"] = time.perf_counter() - start
    return rows


def _source_rows(
    conn: psycopg.Connection[Any], target: _Target, where: str, params: Mapping[str, Any] | None = None
) -> _Rows:
    key = text_sql(target.key_text, "pg")
    values = ", ".join(c.pg for c in target.columns) or "NULL"
    raw = ", ".join(_ident(k) for k in target.keys)
    query = f"SELECT {key}, {raw}, {values} FROM ONLY {target.relation} WHERE {where}"
    rows = _Rows()
    width = len(target.keys)
    for record in conn.execute(query, params or None).fetchall():  # type: ignore[arg-type]
        rows.values[record[0]] = tuple(record[1 + width :])
        rows.raw_keys[record[0]] = tuple(record[1 : 1 + width])
    return rows


def _warehouse_rows(duck: duckdb.DuckDBPyConnection, target: _Target, where: str) -> _Rows:
    key = text_sql(target.key_text, "duck")
    values = ", ".join(c.duck for c in target.columns) or "NULL"
    query = f'SELECT {key}, "{SEQ}", {values} FROM target WHERE {where}'
    rows = _Rows()
    for record in duck.sql(query).fetchall():
        rows.values[record[0]] = tuple(record[2:])
        rows.seqs[record[0]] = record[1]
    return rows


def _shown(target: _Target, key: str) -> str:
    """A key text as ``name=value, ...``."""
    return ", ".join(f"{name}={value}" for name, value in zip(target.keys, key.split(chr(30)), strict=False))


def _diff(target: _Target, src: _Rows, wh: _Rows, only: set[str] | None = None) -> dict[str, Difference]:
    """Differences by key text; each names its key as ``name=value``."""
    found: dict[str, Difference] = {}
    names = [c.name for c in target.columns] or ["(none)"]
    for key in sorted(src.values.keys() | wh.values.keys()):
        if only is not None and key not in only:
            continue
        if key not in wh.values:
            found[key] = Difference(_shown(target, key), "missing in the warehouse")
        elif key not in src.values:
            found[key] = Difference(_shown(target, key), "only in the warehouse")
        elif src.values[key] != wh.values[key]:
            columns = [(n, a, b) for n, a, b in zip(names, src.values[key], wh.values[key], strict=True) if a != b]
            found[key] = Difference(_shown(target, key), "differs", columns)
    return found


def _changed_since(
    delta: DeltaTable, side: DeltaTable | None, target: _Target, found: Mapping[str, Difference], threshold: str
) -> set[str]:
    """Keys of ``found`` the warehouse changed at or after the snapshot (row or delete sequence >= ``threshold``)."""
    if not found:
        return set()
    keys = pa.table({"k": pa.array(sorted(found), pa.string())})
    key_duck = text_sql(target.key_text, "duck")
    newer: set[str] = set()
    with _duck(delta) as duck:
        duck.register("wanted", keys)
        for (key,) in duck.sql(
            f"SELECT {key_duck} FROM target WHERE \"{SEQ}\" >= '{threshold}' AND {key_duck} IN (SELECT k FROM wanted)"
        ).fetchall():
            newer.add(key)
    if side is None or target.sequence_by != SEQ:
        return newer
    with _duck(side) as duck:
        duck.register("wanted", keys)
        truncated = duck.sql(
            f"SELECT count(*) FROM target WHERE \"{OP}\" = '{TRUNCATE_OP}' AND \"{SEQ}\" >= '{threshold}'"
        ).fetchall()[0][0]
        if truncated:
            return set(found)
        for (key,) in duck.sql(
            f"SELECT {key_duck} FROM target WHERE \"{OP}\" = '{DELETE_OP}' AND \"{SEQ}\" >= '{threshold}' "
            f"AND {key_duck} IN (SELECT k FROM wanted)"
        ).fetchall():
            newer.add(key)
    return newer


@contextmanager
def _duck(delta: DeltaTable) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection (UTC) with ``target`` bound to a Delta table's current version."""
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET TimeZone = 'UTC'")
        register_delta(con, "target", delta)
        yield con
    finally:
        con.close()
