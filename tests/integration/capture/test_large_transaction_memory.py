"""Capture's memory over one multi-million-change transaction: under the README's bound, flat in its size.

The README ("Memory of a large transaction") states the bound: capture's RSS stays under
200 MiB + 1.5 x ``sources.<name>.spill_threshold_bytes``, whatever the size of a transaction.
Here a real ``headwater capture --until-caught-up`` (file log, ``fsync: never``, the default
threshold) captures, each as ONE committed transaction of the real embedded PostgreSQL, an
``INSERT ... SELECT generate_series`` of 200,000 rows and then one of 2,000,000. The summed
``VmRSS`` of its process tree is sampled from ``/proc`` every 50 ms (``harness.rss``):

* every run's peak stays under the bound computed from the configured threshold (a run that
  passes it is SIGKILLed there, so a broken bound fails the test at the bound);
* the peak at 2,000,000 changes is within :data:`GROWTH_MARGIN_MIB` of the peak at 200,000
  measured in the same test: ten times the transaction, the same memory (held whole, each
  change costs ~1.75 KB: +3 GB);
* the log holds each of the 2,200,000 rows once and one BEGIN/END pair per transaction
  counting its changes, and no spill file is left.

Capture at rest (the first run, which only creates the slot) is printed beside the peaks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from harness.processes import die_with_parent
from harness.rss import TreeRss
from harness.topics import read_topic

from core.source_config import SPILL_THRESHOLD_BYTES
from log.file.backend import FileLog

ROOT = Path(__file__).resolve().parents[3]
PASSWORD_VAR = "HW_BIGTXN_RSS_PASSWORD"
MIB = 1 << 20
#: The README's bound: capture's RSS stays under this plus 1.5 x the spill threshold.
BOUND_BASE_MIB = 200
BOUND_THRESHOLD_FACTOR = 1.5
#: How much higher the peak at ten times the changes may be than the peak at 200,000.
GROWTH_MARGIN_MIB = 32
SMALL, LARGE = 200_000, 2_000_000


def bound_mib(threshold_bytes: int) -> float:
    return BOUND_BASE_MIB + BOUND_THRESHOLD_FACTOR * threshold_bytes / MIB


class Capture:
    """``headwater capture --until-caught-up`` of one source on table ``big``, its RSS sampled."""

    def __init__(self, pg_database: Any, home: Path) -> None:
        self.name = pg_database.name
        self.home = home
        password = pg_database.server.password
        source = {
            "dsn": pg_database.dsn.replace(password, "${" + PASSWORD_VAR + "}"),
            "tables": ["public.big"],
            "snapshot": "never",
            "transactions": True,
            "spill_threshold_bytes": SPILL_THRESHOLD_BYTES,
        }
        document = {
            "project": "bigrss",
            "home": str(home),
            "log": {"file": {"fsync": "never"}},
            "sources": {self.name: source},
        }
        self.config = home.parent / "headwater.yaml"
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_text(orjson.dumps(document).decode())
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), PASSWORD_VAR: password}
        self.topic = f"{self.name}.public.big"
        self.bound_mib = bound_mib(SPILL_THRESHOLD_BYTES)

    def run(self, what: str, timeout_s: float = 900) -> float:
        """Capture until caught up; its peak tree RSS in MiB (asserted under the bound)."""
        command = [sys.executable, "-m", "headwater", "--config", str(self.config), "capture", "--until-caught-up"]
        started = time.monotonic()
        process = subprocess.Popen(
            command,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # the sampler kills its group past the bound
            preexec_fn=die_with_parent,
        )
        sampler = TreeRss(process.pid, every_s=0.05, limit_kib=int(self.bound_mib * 1024))
        try:
            _, err = process.communicate(timeout=timeout_s)
        finally:
            sampler.stop()
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        peak = sampler.peak_kib / 1024
        print(f"{what}: peak RSS {peak:.0f} MiB, {sampler.samples} samples, {time.monotonic() - started:.1f} s")
        assert sampler.killed_at_kib is None, (
            f"{what}: capture's RSS reached {sampler.killed_at_kib / 1024:.0f} MiB, over the bound "
            f"{self.bound_mib:.0f} MiB (200 MiB + 1.5 x the {SPILL_THRESHOLD_BYTES / MIB:.0f} MiB spill threshold): "
            f"killed there"
        )
        assert process.returncode == 0, err
        assert sampler.samples >= 5, f"{what}: too few RSS samples to tell a peak"
        return peak


def insert(pg_database: Any, first: int, rows: int) -> None:
    """One transaction inserting ids ``first`` .. ``first + rows - 1``."""
    pg_database.execute(
        "INSERT INTO big SELECT g, g %% 1000, 'a label of about forty bytes, row ' || g, now() "
        "FROM generate_series(%s::bigint, %s::bigint) g",
        (first, first + rows - 1),
    )


def logged_ids(home: Path, topic: str) -> pa.Array:
    """The ``id`` of every record's key in the topic (keys ``{"id":N}``, every event an insert), as Arrow."""
    chunks = []
    with FileLog(home / "log") as log:
        for partition in range(log.describe_topic(topic).partitions):
            offset, end = 0, log.end_offset(topic, partition)
            while offset < end:
                columns, after = log.read_columns(topic, partition, offset, end)
                assert after > offset, f"{topic}/{partition}: no progress at offset {offset} of {end}"
                keys = pc.cast(columns.keys, pa.string())
                assert pc.all(pc.starts_with(keys, '{"id":')).as_py(), "a key other than {id}"
                inserts = pc.match_substring(pc.cast(columns.values, pa.string()), '"op":"c"')
                assert pc.all(inserts).as_py() and inserts.null_count == 0, "an event other than an insert"
                chunks.append(pc.cast(pc.utf8_slice_codeunits(keys, 6, -1), pa.int64()))
                offset = after
    return pa.chunked_array(chunks, pa.int64()).combine_chunks()


def test_peak_rss_of_a_multi_million_change_transaction_stays_under_the_bound_and_flat(
    pg_database: Any, tmp_path: Path
) -> None:
    pg_database.execute("CREATE TABLE big (id bigint PRIMARY KEY, n int, label text, at timestamptz)")
    pg_database.execute(f"CREATE PUBLICATION headwater_{pg_database.name} FOR TABLE big")
    capture = Capture(pg_database, tmp_path / "home")
    at_rest = capture.run("at rest (creates the slot)")
    insert(pg_database, 1, SMALL)
    small = capture.run(f"{SMALL:,} changes in one transaction")
    started = time.monotonic()
    insert(pg_database, SMALL + 1, LARGE)
    print(f"INSERT of {LARGE:,} rows: {time.monotonic() - started:.1f} s")
    large = capture.run(f"{LARGE:,} changes in one transaction")
    print(f"at rest {at_rest:.0f} MiB, bound {capture.bound_mib:.0f} MiB")
    assert large <= small + GROWTH_MARGIN_MIB, (
        f"peak RSS grew with the transaction: {small:.0f} MiB at {SMALL:,} changes, {large:.0f} MiB at {LARGE:,}"
    )

    rows = SMALL + LARGE
    started = time.monotonic()
    ids = logged_ids(capture.home, capture.topic)
    print(f"{len(ids):,} keys read back in {time.monotonic() - started:.1f} s")
    # rows records whose ids are rows distinct values in 1 .. rows: each row once.
    assert len(ids) == rows, f"{len(ids):,} events logged for {rows:,} changes"
    assert pc.min(ids).as_py() == 1 and pc.max(ids).as_py() == rows
    assert pc.count_distinct(ids).as_py() == rows, "a change logged twice"
    with FileLog(capture.home / "log") as log:
        boundaries = [orjson.loads(r.value) for r in read_topic(log, f"{capture.name}.transaction") if r.value]
    assert sorted(b["status"] for b in boundaries) == ["BEGIN", "BEGIN", "END", "END"]
    assert sorted(b["event_count"] for b in boundaries if b["status"] == "END") == [SMALL, LARGE]
    spill = capture.home / "capture" / capture.name / "spill"
    assert not list(spill.glob("*.spill")), "spill files outlived their transaction"
