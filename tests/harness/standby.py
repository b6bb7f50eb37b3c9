"""A primary and a physical standby (``pg_basebackup -R``), for failover and standby-capture tests.

Both are :class:`~operations.embedded_postgres.EmbeddedPostgres` servers of one version, in their
own temp dir, stopped (and removed) when the test's ``stop`` runs or at session end. What the
setup must get right (found on 17.11 and 18.6):

* ``synchronized_standby_slots`` goes into the primary's own settings file, never ``ALTER
  SYSTEM``: ``pg_basebackup`` copies ``postgresql.auto.conf``, and a promoted standby that names
  a slot it does not have makes its logical walsenders wait forever.
* The standby's ``primary_conninfo`` must hold ``dbname`` (the slot sync worker needs it):
  ``pg_basebackup -d 'dbname=...' -R`` writes it.
* ``hot_standby_feedback=on``: without it catalog cleanup on the primary invalidates logical
  slots on the standby (``rows_removed``).
* A synced slot stays ``temporary`` until the primary's slot moves past the standby's position;
  :meth:`StandbyPair.wait_synced` pokes the primary (``pg_log_standby_snapshot()``) meanwhile.
* Everything DDL (tables, publications) is best done before the base backup, for the same reason.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.postgres import TEST_TIMEZONE
from harness.processes import stop_at_exit
from harness.reaper import reap_when_gone
from operations.embedded_postgres import EmbeddedPostgres

PHYSICAL_SLOT = "standby_slot"
_SERVER_SETTINGS = {"fsync": "off", "full_page_writes": "on", "max_replication_slots": "32", "max_wal_senders": "32"}


def _as_nobody() -> dict[str, Any]:
    if os.geteuid() != 0:
        return {}
    return {"user": "nobody", "group": pwd.getpwnam("nobody").pw_gid, "extra_groups": []}


def _run(args: list[str], *, env: dict[str, str] | None = None, timeout_s: float = 120) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    clean.update(LC_ALL="C.UTF-8", LANG="C.UTF-8", TZ="UTC", **({"HOME": "/"} if os.geteuid() == 0 else {}))
    result = subprocess.run(
        args, cwd="/", capture_output=True, text=True, env={**clean, **(env or {})}, timeout=timeout_s,
        check=False, **_as_nobody(),
    )  # fmt: skip
    if result.returncode != 0:
        msg = f"{' '.join(args[:2])} failed ({result.returncode}): {(result.stderr or result.stdout).strip()[-2000:]}"
        raise RuntimeError(msg)


@dataclass
class StandbyPair:
    """A running primary and its streaming standby."""

    primary: EmbeddedPostgres
    standby: EmbeddedPostgres
    bin_dir: Path
    root: Path

    def multi_host_dsn(self, dbname: str, *, password_ref: str | None = None) -> str:
        """``host=..,.. port=P_PRIMARY,P_STANDBY ... target_session_attrs=read-write``: whichever is the primary."""
        password = password_ref if password_ref is not None else self.primary.password
        return (
            f"host={self.primary.host},{self.standby.host} port={self.primary.port},{self.standby.port} "
            f"user={self.primary.superuser} password={password} dbname={dbname} target_session_attrs=read-write"
        )

    def wait_synced(self, slot: str, dbname: str, timeout_s: float = 90) -> None:
        """Wait until the standby holds a persistent synced copy of logical ``slot``."""
        query = f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}' AND synced AND NOT temporary"
        deadline = time.monotonic() + timeout_s
        while not self.standby.execute(query)[0][0]:
            if time.monotonic() > deadline:
                state = self.standby.execute(f"SELECT * FROM pg_replication_slots WHERE slot_name = '{slot}'")
                raise AssertionError(f"slot {slot} not synced to the standby after {timeout_s} s: {state}")
            # A running-xacts record lets the standby build the slot's snapshot.
            self.primary.execute("SELECT pg_log_standby_snapshot()", dbname=dbname)
            time.sleep(0.5)

    def wait_replayed(self, timeout_s: float = 60) -> None:
        """Wait until the standby has replayed the primary's current WAL position."""
        target = self.primary.execute("SELECT pg_current_wal_lsn()")[0][0]
        wait_until(
            lambda: self.standby.execute(f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn")[0][0],
            timeout_s,
            "the standby to replay the primary's WAL",
        )

    def promote(self) -> None:
        """Crash the primary (immediate stop: a failover, not a switchover) and promote the standby."""
        self.primary.stop("immediate")
        _run([str(self.bin_dir / "pg_ctl"), "-D", str(self.standby.data_dir), "promote", "-w", "-t", "60"])


def start_standby_pair(
    bin_dir: Path,
    *,
    before_backup: Callable[[EmbeddedPostgres], None] | None = None,
    primary_settings: dict[str, str] | None = None,
    standby_settings: dict[str, str] | None = None,
) -> tuple[StandbyPair, Callable[[], None]]:
    """Start a primary, run ``before_backup(primary)`` (schema, publications), then its standby.

    The standby streams through physical slot :data:`PHYSICAL_SLOT`, with ``hot_standby_feedback``.
    Returns the pair and an idempotent stop-and-remove (also run at session end).
    """
    root = Path(tempfile.mkdtemp(prefix="hw-pair-"))
    settings = {**_SERVER_SETTINGS, **(primary_settings or {})}
    primary = EmbeddedPostgres(root / "primary", timezone=TEST_TIMEZONE, bin_dir=bin_dir, settings=settings)
    standby: EmbeddedPostgres | None = None

    def stop() -> None:
        try:
            for server in (standby, primary):
                if server is not None and server.running:
                    server.stop("immediate")
        finally:
            shutil.rmtree(root, ignore_errors=True)

    stopper = stop_at_exit(stop)
    try:
        primary.start()
        primary.execute(f"SELECT pg_create_physical_replication_slot('{PHYSICAL_SLOT}', true)")
        if before_backup is not None:
            before_backup(primary)
        data = root / "standby"
        data.mkdir(mode=0o700)
        if os.geteuid() == 0:
            shutil.chown(data, "nobody", pwd.getpwnam("nobody").pw_gid)
        _run(
            [
                str(bin_dir / "pg_basebackup"),
                "-d", f"host={primary.host} port={primary.port} user={primary.superuser} dbname=postgres",
                "-D", str(data), "-X", "stream", "-c", "fast", "-R", "-S", PHYSICAL_SLOT,
            ],
            env={"PGPASSWORD": primary.password},
        )  # fmt: skip
        standby = EmbeddedPostgres(
            data,
            timezone=TEST_TIMEZONE,
            bin_dir=bin_dir,
            settings={**_SERVER_SETTINGS, "hot_standby_feedback": "on", **(standby_settings or {})},
        )
        standby.start()
    except BaseException:
        stopper()
        raise
    reap_when_gone(root, [primary.data_dir, data])  # pg_ctl daemonises: a SIGKILLed worker cannot stop them
    return StandbyPair(primary, standby, bin_dir, root), stopper


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` every 0.2 s until it is true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
