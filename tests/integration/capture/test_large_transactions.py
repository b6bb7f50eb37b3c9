"""Large transactions through the real ``headwater capture``: spilled in pieces, exactly once, nothing of an abort.

Correctness at a small scale (the source's database has ``logical_decoding_work_mem = 64kB``,
so Postgres streams a transaction while it runs, and capture the smallest
``spill_threshold_bytes``, 1 MiB, so ~20k changes spill and are built back in pieces):

* A 20,000-row UPDATE spilled (a spill file seen while the transaction is open) gives events
  identical to the same transaction captured unspilled by a second source on the same slot's
  database (default threshold), with one BEGIN and one END counting them.
* SIGKILL mid-spill (the transaction still open in Postgres, its changes streamed and spilled)
  and mid-append (some of its ``max_batch_records`` pieces in the log, 60,000 rows in 3): after
  a restart the log holds every change once, one BEGIN and one END counting them, and no spill file.
* A spilled transaction rolled back leaves nothing; a subtransaction rolled back inside a
  spilled one leaves nothing of its own.
* The spill directory on a full disk (a real size-limited tmpfs): capture pauses, says so,
  acknowledges nothing, and goes on when there is room.

Memory at scale (capture's peak RSS over a 2,000,000-change transaction stays under the
README's bound, 200 MiB + 1.5 x the threshold, and does not grow from 200,000 changes) is
``test_large_transaction_memory.py``; 20,000,000 changes and the code before spilling are
measured by ``bench/big_transaction_bench.py``, its results in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from harness.tmpfs import tmpfs
from harness.topics import read_topic

from log.file.backend import FileLog

ROOT = Path(__file__).resolve().parents[3]
PASSWORD_VAR = "HW_BIGTXN_PASSWORD"
MIB = 1 << 20
#: capture's max_batch_records: a transaction is appended in pieces of this many records.
PIECE = 20_000


class Project:
    """A headwater.yaml with one source on table ``big`` and the capture commands on it."""

    def __init__(self, pg_database: Any, home: Path, *, name: str | None = None, **source: Any) -> None:
        self.db = pg_database
        self.name = name or pg_database.name
        if name is not None:  # a second source on the same database: its own slot, the same publication
            source = {
                "slot": f"headwater_{pg_database.name}_{name}",
                "publication": f"headwater_{pg_database.name}",
                **source,
            }
        self.home = home
        password = pg_database.server.password
        settings = {
            "dsn": pg_database.dsn.replace(password, "${" + PASSWORD_VAR + "}"),
            "tables": ["public.big"],
            "snapshot": "never",
            "transactions": True,
            "heartbeat_interval_s": 1,
            **source,
        }
        self.config = home.parent / "headwater.yaml"
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            orjson.dumps({"project": "big", "home": str(home), "sources": {self.name: settings}}).decode()
        )
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), PASSWORD_VAR: password}
        self.topic = f"{self.name}.public.big"
        self.spill_dir = home / "capture" / self.name / "spill"

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "headwater", "--config", str(self.config), "capture", *args]

    def until_caught_up(self, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.command("--until-caught-up"), env=self.env, capture_output=True, text=True, timeout=timeout_s
        )
        assert done.returncode == 0, done.stderr
        return done

    def follow(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command("--follow", "--no-cleaner"),
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def events_by_commit(self) -> tuple[Counter[int], Counter[tuple[int, bytes]]]:
        """Events per commit LSN, and per (commit LSN, key)."""
        per_commit: Counter[int] = Counter()
        per_key: Counter[tuple[int, bytes]] = Counter()
        with FileLog(self.home / "log") as log:
            if self.topic not in log.list_topics():
                return per_commit, per_key
            for record in read_topic(log, self.topic):
                if record.value is None:
                    continue
                commit = orjson.loads(record.value)["source"]["commit_lsn"]
                per_commit[commit] += 1
                per_key[commit, bytes(record.key or b"")] += 1
        return per_commit, per_key

    def boundaries(self) -> list[dict[str, Any]]:
        with FileLog(self.home / "log") as log:
            topic = f"{self.name}.transaction"
            if topic not in log.list_topics():
                return []
            return [orjson.loads(r.value) for r in read_topic(log, topic) if r.value is not None]

    def logged_events(self) -> int:
        """Records in the table's topic now (file log end offsets)."""
        with FileLog(self.home / "log") as log:
            if self.topic not in log.list_topics():
                return 0
            return sum(log.end_offset(self.topic, p) for p in range(log.describe_topic(self.topic).partitions))


def create_big(pg_database: Any, rows: int, *, stream: bool) -> None:
    pg_database.execute("CREATE TABLE big (id bigint PRIMARY KEY, n int, label text, at timestamptz)")
    pg_database.execute(
        "INSERT INTO big SELECT g, 0, 'a label of about forty bytes, row ' || g, now() "
        "FROM generate_series(1, %s::bigint) g",
        (rows,),
    )
    pg_database.execute(f"CREATE PUBLICATION headwater_{pg_database.name} FOR TABLE big")
    if stream:
        pg_database.execute(f"ALTER DATABASE \"{pg_database.name}\" SET logical_decoding_work_mem = '64kB'")


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return found


def spill_files(project: Project) -> list[Path]:
    return sorted(project.spill_dir.glob("*.spill")) if project.spill_dir.exists() else []


@contextlib.contextmanager
def killed_on_exit(process: subprocess.Popen[str]) -> Iterator[None]:
    try:
        yield
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def events_of(project: Project) -> list[dict[str, Any]]:
    """The table topic's event values in log order, without what names the source or the capture time."""
    values = []
    with FileLog(project.home / "log") as log:
        for record in read_topic(log, project.topic):
            assert record.value is not None
            value = orjson.loads(record.value)
            value["source"].pop("name")
            for field in ("ts_ms", "ts_us", "ts_ns"):
                value.pop(field, None)
            values.append(value)
    return values


def test_a_spilled_transaction_gives_the_events_of_the_same_transaction_unspilled(
    pg_database: Any, tmp_path: Path
) -> None:
    rows = 20_000
    create_big(pg_database, rows, stream=True)
    spilled = Project(pg_database, tmp_path / "spilled" / "home", name="spilled", spill_threshold_bytes=MIB)
    whole = Project(pg_database, tmp_path / "whole" / "home", name="whole")  # default threshold: held whole
    spilled.until_caught_up()
    whole.until_caught_up()  # both slots: from here on
    process = spilled.follow()
    with killed_on_exit(process):
        with psycopg.connect(pg_database.dsn) as conn:
            conn.execute("UPDATE big SET n = n + 1, label = label || '!'")
            # Still open in Postgres: streamed, and past the threshold spilled.
            wait_until(lambda: any(p.stat().st_size > 0 for p in spill_files(spilled)), 120, "a spill file")
            conn.commit()
        wait_until(lambda: len(spilled.boundaries()) == 2, 120, "the spilled transaction in the log")
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
    whole.until_caught_up()
    assert spill_files(whole) == []
    assert spill_files(spilled) == [], "spill files outlived their transaction"
    events = events_of(spilled)
    assert len(events) == rows
    assert sorted(v["after"]["id"] for v in events) == list(range(1, rows + 1))
    assert events == events_of(whole)
    for project in (spilled, whole):
        boundaries = project.boundaries()
        assert [b["status"] for b in boundaries] == ["BEGIN", "END"]
        assert boundaries[1]["event_count"] == rows


@pytest.mark.parametrize("moment", ["spill", "append"])
def test_sigkill_mid_spill_or_mid_append_leaves_the_transaction_once(
    pg_database: Any, tmp_path: Path, moment: str
) -> None:
    rows = 3 * PIECE
    create_big(pg_database, rows, stream=True)
    project = Project(pg_database, tmp_path / "home", spill_threshold_bytes=MIB)
    project.until_caught_up()
    process = project.follow()
    with killed_on_exit(process):
        conn = psycopg.connect(pg_database.dsn)
        try:
            conn.execute("UPDATE big SET n = n + 1")
            if moment == "spill":
                # Still open in Postgres: streamed, spilled, nothing of it can be in the log.
                wait_until(lambda: any(p.stat().st_size > 0 for p in spill_files(project)), 120, "a spill file")
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                conn.commit()
            else:
                conn.commit()
                # The first piece (a flush of max_batch_records) is in the log, not all of them.
                wait_until(lambda: project.logged_events() >= PIECE, 120, "part of the transaction in the log")
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        finally:
            conn.close()
    logged = project.logged_events()
    if moment == "spill":
        assert logged == 0
    else:
        assert PIECE <= logged < rows, "killed halfway through the append"
    assert process.returncode == -signal.SIGKILL
    project.until_caught_up()
    per_commit, per_key = project.events_by_commit()
    assert list(per_commit.values()) == [rows], per_commit
    assert set(per_key.values()) == {1}, "a change twice"
    boundaries = project.boundaries()
    assert [b["status"] for b in boundaries] == ["BEGIN", "END"]
    assert boundaries[1]["event_count"] == rows
    assert spill_files(project) == [], "spill files outlived their transaction"


def test_a_spilled_transaction_rolled_back_leaves_nothing_nor_does_a_rolled_back_subtransaction(
    pg_database: Any, tmp_path: Path
) -> None:
    rows = 20_000
    create_big(pg_database, rows, stream=True)
    project = Project(pg_database, tmp_path / "home", spill_threshold_bytes=MIB)
    project.until_caught_up()
    process = project.follow()
    with killed_on_exit(process):
        with psycopg.connect(pg_database.dsn) as conn:
            conn.execute("UPDATE big SET n = 7")
            wait_until(lambda: spill_files(project), 120, "the aborted transaction's spill file")
            conn.rollback()
        with psycopg.connect(pg_database.dsn) as conn:
            conn.execute("UPDATE big SET n = 1 WHERE id <= 10000")
            conn.execute("SAVEPOINT s")
            conn.execute("UPDATE big SET n = 2 WHERE id > 10000")
            conn.execute("ROLLBACK TO SAVEPOINT s")
            conn.execute("UPDATE big SET n = 3 WHERE id > 15000")
            conn.commit()
        wait_until(lambda: len(project.boundaries()) == 2, 120, "the committed transaction")
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
    with FileLog(project.home / "log") as log:
        values = [orjson.loads(r.value) for r in read_topic(log, project.topic) if r.value is not None]
    assert {v["after"]["n"] for v in values} == {1, 3}, "only the committed changes"
    assert sorted(v["after"]["id"] for v in values) == [*range(1, 10_001), *range(15_001, rows + 1)]
    assert len({v["source"]["commit_lsn"] for v in values}) == 1
    assert project.boundaries()[1]["event_count"] == len(values)
    assert spill_files(project) == []


def test_a_full_spill_disk_pauses_capture_without_acknowledging_until_there_is_room(
    pg_database: Any, tmp_path: Path
) -> None:
    rows = 30_000
    create_big(pg_database, rows, stream=True)
    project = Project(pg_database, tmp_path / "home", spill_threshold_bytes=MIB)
    project.until_caught_up()
    slot = f"headwater_{project.name}"
    with tmpfs(project.spill_dir, "8m"):
        filler = project.spill_dir / "filler.bin"  # the disk is full before capture starts (it removes *.spill only)
        with contextlib.suppress(OSError), filler.open("wb", buffering=0) as handle:
            while True:
                handle.write(b"\0" * 65536)
        process = subprocess.Popen(
            project.command("--follow", "--no-cleaner"),
            env=project.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")), daemon=True)
        with killed_on_exit(process):
            reader.start()
            pg_database.execute("UPDATE big SET n = n + 1")
            [(written,)] = pg_database.execute("SELECT pg_current_wal_lsn()")
            wait_until(lambda: any("spill disk full at" in line for line in lines), 120, "the spill-disk-full line")
            time.sleep(2.5)  # a few retries while the disk stays full
            [(behind,)] = pg_database.execute(
                "SELECT confirmed_flush_lsn < %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                (written, slot),
            )
            assert behind, "capture acknowledged the transaction while its changes could not be spilled"
            assert project.logged_events() == 0
            assert process.poll() is None, "capture exited instead of pausing"
            filler.unlink()
            wait_until(lambda: project.logged_events() >= rows, 180, "the transaction after the pause")
            wait_until(lambda: any("spill disk writable again" in line for line in lines), 30, "the resumed line")
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
            assert process.returncode == 0, "".join(lines)
    per_commit, per_key = project.events_by_commit()
    assert list(per_commit.values()) == [rows]
    assert set(per_key.values()) == {1}
