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
Postgres and in DuckDB over the table's files, and summed per key-hash bucket with a row
count (about 64 rows per bucket). Only the buckets whose count or sum differ are read
again, row by row, and compared per key and column. A single integer key the source
indexes is bucketed by key range, so that second read is a few index ranges; any other
key is bucketed by hash and the second read scans the source again. Only the differing
buckets travel.

**Rows newer than the snapshot.** A differing key whose warehouse row (``__hw_seq``) or
delete (its tombstone) is at or past ``C`` changed after the snapshot: it is compared
again at a new consistent point, up to ``rounds`` times; a key still changing then is
reported as unsettled, never as a difference.

**Other source kinds** (MySQL/MariaDB) offer :class:`capture.consistent_read.ConsistentReads`
instead: a read of the table at a consistent point ``P`` as capture's own events, decoded and
compared chunk by chunk (:mod:`operations.image_diff`). The table is compared once capture's
saved position is at or past ``P`` (an idle capture is run here until caught up) and the load
caught up as above; a differing key whose warehouse row or delete is at or past
``Sequence(P + 1, 0)`` changed after the read and is compared again at a new point.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
import psycopg
from psycopg import sql

from core.config import ProjectConfig
from core.errors import PermanentError, TransientError
from core.leases import lease
from core.table_leases import reading
from log.base import Log
from log.factory import open_log
from log.sequence import Lsn
from log.sequence import Sequence as ChangeSequence
from log.table_schemas import read_schema_records
from log.topics import load_group
from operations.image_diff import ImageDecoder, compare_images, key_texts
from operations.row_hashes import canonical_columns
from operations.table_diff import Difference, DiffTarget, changed_since, compare_all, compare_keys, quoted, shown_key
from spark_log.versions import resolve_topic
from warehouse_loader.changes import SEQ
from warehouse_loader.errors import WarehouseError
from warehouse_loader.formats import format_of
from warehouse_loader.load_job import UnknownWarehouseTableError, load_identity, table_keys, table_path
from warehouse_loader.location import TableLocation
from warehouse_loader.quality import verify_runs_path
from warehouse_loader.table_format import StoredTable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from capture.consistent_read import ConsistentRead, ConsistentReads

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
    #: How the point is named (None: ``LSN <lsn> (exported snapshot)``, PostgreSQL's).
    at: str | None = None

    @property
    def equal(self) -> bool:
        """No key differs and none is left unsettled."""
        return not self.differences and not self.unsettled

    def lines(self) -> list[str]:
        """The report, a line each (what ``headwater verify`` prints)."""
        out = [
            f"{self.table}: source {self.source_table} at {self.at or f'LSN {self.lsn} (exported snapshot)'}; "
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
    wait = _Waiting(timeout_s, deadline, load, spark, say)
    # Held for every round: no vacuum removes the files of a version while it is compared.
    with reading(config.home_dir, table_path(config, name).name):
        if config.sources[target.source].kind == "postgres":
            found = _pg_rounds(config, target, rounds, wait)
        else:
            found = _image_rounds(config, target, rounds, wait)
    assert found.first is not None
    source_rows, warehouse_rows, buckets, differing = found.first
    result = VerifyResult(
        table=name,
        source_table=target.relation,
        lsn=found.point,
        source_rows=source_rows,
        warehouse_rows=warehouse_rows,
        buckets=buckets,
        differing_buckets=differing,
        differences=[found.confirmed[k] for k in sorted(found.confirmed)],
        unsettled=sorted(shown_key(target, key) for key in found.pending),
        not_compared=target.not_compared or found.not_compared,
        rounds=found.rounds,
        seconds=time.monotonic() - started,
        timings=found.timings,
        at=found.at,
    )
    if record:
        path = verify_runs_path(config)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as handle:
            handle.write(orjson.dumps(result.as_json()) + b"\n")
    return result


@dataclass(frozen=True)
class _Waiting:
    """How a round waits for the table to pass its point (see :func:`_wait_load`)."""

    #: Seconds a consistent point may take (PostgreSQL's slot waits for open transactions).
    timeout_s: float
    deadline: float
    load: bool
    spark: SparkSession | None
    say: Callable[[str], None] | None


@dataclass
class _Rounds:
    """What the rounds found: the first round's counts, the confirmed and the still-changing keys."""

    first: tuple[int, int, int, int] | None = None
    confirmed: dict[str, Difference] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)
    point: str = ""
    #: How the result names the point (None: PostgreSQL's ``LSN ... (exported snapshot)``).
    at: str | None = None
    rounds: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    not_compared: list[str] = field(default_factory=list)

    def settle(self, found: Mapping[str, Difference], newer: set[str]) -> bool:
        """Confirm the keys not changed after the round's point; True when none is left to compare again."""
        for key, difference in found.items():
            if key not in newer:
                self.confirmed[key] = difference
        self.pending = {key for key in found if key in newer}
        return not self.pending


def _pg_rounds(config: ProjectConfig, target: DiffTarget, rounds: int, wait: _Waiting) -> _Rounds:
    """PostgreSQL: an exported snapshot per round, hashes per bucket in SQL (:mod:`operations.table_diff`)."""
    out = _Rounds()
    pending: set[str] | None = None  # None: the whole table
    for attempt in range(1, rounds + 1):
        out.rounds = attempt
        with _Snapshot(target.dsn, wait.timeout_s) as snapshot:
            out.point = str(snapshot.lsn)
            if wait.say:
                wait.say(
                    f"snapshot of {target.relation} at LSN {out.point}; waiting for the table to be loaded past it"
                )
            _wait_loaded(config, target, snapshot.lsn, wait)
            where, stored = _stored(config, target.name)
            if pending is None:
                counts, found = compare_all(snapshot.conn, where, stored, target, out.timings)
                out.first = counts
            else:
                found = compare_keys(snapshot.conn, where, stored, target, pending)
        threshold = ChangeSequence(snapshot.lsn.value, 0).sortable()
        side = format_of(config, target.name).tombstones(where)
        if out.settle(found, changed_since(where, stored, side, target, found, threshold)):
            break
        pending = out.pending
    return out


def _image_rounds(config: ProjectConfig, target: DiffTarget, rounds: int, wait: _Waiting) -> _Rounds:
    """A kind reading rows as events: a consistent read per round, compared by chunk (:mod:`operations.image_diff`)."""
    from capture.consistent_read import ConsistentReads
    from capture.kinds import kind_of

    kind = kind_of(config, target.source)
    assert isinstance(kind, ConsistentReads)
    log = open_log(config)
    try:
        decoder = ImageDecoder(config, log, target.topic)
    finally:
        log.close()
    out = _Rounds()
    pending: set[str] | None = None  # None: the whole table
    for attempt in range(1, rounds + 1):
        out.rounds = attempt
        with kind.consistent_read(config, target.source, target.topic) as read:
            out.point = read.label
            out.at = f"binlog position {read.label} (consistent snapshot)"
            if wait.say:
                wait.say(f"snapshot of {read.table} at {out.at}; waiting for the table to be loaded past it")
            _wait_captured(config, target, kind, read, wait.deadline)
            _wait_load(config, target, f"binlog position {read.label}", wait)
            where, stored = _stored(config, target.name)
            compared = compare_images(read, decoder, where, stored, target, pending)
        if pending is None:
            out.first = (compared.source_rows, compared.warehouse_rows, compared.chunks, compared.differing_chunks)
            out.not_compared = compared.not_compared
        # The read holds every change committed at or before its point; later ones sort at or past point + 1.
        threshold = ChangeSequence(read.point + 1, 0).sortable()
        side = format_of(config, target.name).tombstones(where)
        found = compared.differences
        if out.settle(found, changed_since(where, stored, side, target, found, threshold)):
            break
        pending = out.pending
    return out


def _stored(config: ProjectConfig, name: str) -> tuple[TableLocation, StoredTable]:
    """The table's location and its current version."""
    where = table_path(config, name)
    stored = format_of(config, name).open(where)
    if stored is None:
        msg = f"table {name!r} is not loaded yet; run 'headwater load {name} --available-now'"
        raise VerifyError(msg)
    return where, stored


# --------------------------------------------------------------------------- the target


def _resolve(config: ProjectConfig, log: Log, name: str) -> DiffTarget:
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
    latest = max(records, key=lambda record: int(record.get("version", 0)))
    if source.kind != "postgres":
        return _image_target(config, log, name, topic, latest)
    _, table = _stored(config, name)
    keys = table_keys(config, log, name)
    stored = table.schema()
    by_name = {c["name"]: c for c in latest["columns"]}
    key_text, _ = canonical_columns([by_name[k] for k in keys], stored, source.types)
    if len(key_text) != len(keys):
        msg = f"{name!r}: its key ({', '.join(keys)}) has a type verify cannot compare exactly"
        raise VerifyError(msg)
    columns, skipped = canonical_columns([c for c in latest["columns"] if c["name"] not in keys], stored, source.types)
    slot = source.slot or f"headwater_{source_name.lower()}"
    relation = f"{quoted(latest['schema'])}.{quoted(latest['table'])}"
    return DiffTarget(
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


def _image_target(config: ProjectConfig, log: Log, name: str, topic: str, latest: Mapping[str, Any]) -> DiffTarget:
    """The target of a table whose source kind reads rows as events (:mod:`operations.image_diff`)."""
    from capture.consistent_read import ConsistentReads
    from capture.kinds import kind_of

    source_name = topic.split(".", 1)[0]
    kind = config.sources[source_name].kind
    if not isinstance(kind_of(config, source_name), ConsistentReads):
        msg = (
            f"verify is not available for {kind} sources: {name!r} is loaded from source {source_name!r}; "
            "compare it with its source table by hand"
        )
        raise VerifyError(msg)
    keys = table_keys(config, log, name)
    if not keys:
        msg = f"{name!r}: its source table {latest['schema']}.{latest['table']} has no key: nothing to compare rows by"
        raise VerifyError(msg)
    _stored(config, name)  # refused in one line when the table is not loaded yet
    return DiffTarget(
        name=name,
        build=load_identity(config, name)[0],
        topic=topic,
        source=source_name,
        slot="",
        dsn="",
        relation=f"{latest['schema']}.{latest['table']}",
        keys=keys,
        key_text=key_texts(keys),
        columns=[],
        not_compared=[],
        sequence_by=config.warehouse.tables[name].sequence_by or SEQ,
    )


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


def _wait_loaded(config: ProjectConfig, target: DiffTarget, lsn: Lsn, wait: _Waiting) -> None:
    """Return once the table holds every change before ``lsn`` (see module doc), else raise at the deadline."""
    deadline = wait.deadline
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
            rereading = _rereading(config, target)
            if (confirmed >= lsn or (ran_capture and not active)) and not rereading:
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
                if rereading:
                    msg = (
                        f"capture of source {target.source} is still reading {target.relation} again after a schema "
                        "change; retry when it is done (headwater status shows it), or raise --timeout"
                    )
                raise VerifyWaitError(msg)
            time.sleep(0.2)
    _wait_load(config, target, f"LSN {lsn}", wait)


def _wait_captured(
    config: ProjectConfig, target: DiffTarget, kind: ConsistentReads, read: ConsistentRead, deadline: float
) -> None:
    """Return once the log holds every change of the source up to the read's point, else raise at ``deadline``.

    Capture has passed it when its saved position is at or past it; an idle capture (its lease
    free) is run here until caught up, after which the log holds everything the source had then.
    """
    point, label = read.point, read.label
    ran_capture = False
    while True:
        captured = kind.captured_to(config, target.source)
        held = lease(config.home_dir, "capture", target.source)
        idle = held.try_acquire()
        held.release()
        if (captured is not None and captured >= point) or (ran_capture and idle):
            return
        if idle and not ran_capture:
            _capture(config, target.source)
            ran_capture = True
            continue
        if time.monotonic() > deadline:
            msg = (
                f"capture of source {target.source} has not yet passed the snapshot's binlog position {label}; "
                "is its capture stuck? retry, or raise --timeout"
            )
            raise VerifyWaitError(msg)
        time.sleep(0.2)


def _wait_load(config: ProjectConfig, target: DiffTarget, point: str, wait: _Waiting) -> None:
    """Return once the table's loader committed every offset its topic has now (capture passed the point)."""
    deadline, load, spark = wait.deadline, wait.load, wait.spark
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
                f"snapshot at {point}; start 'headwater load {target.name} --follow' (or pass --load when no "
                "loader runs) and retry, or raise --timeout"
            )
            raise VerifyWaitError(msg)
        time.sleep(0.5)


def _rereading(config: ProjectConfig, target: DiffTarget) -> bool:
    """True while capture still reads the table again after a schema change (its rows may not be all in the log)."""
    from capture.kinds import kind_of

    return target.topic in kind_of(config, target.source).rereading(config, target.source)


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
