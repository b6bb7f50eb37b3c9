"""A throwaway MariaDB server run from the local server binaries (for tests and a MySQL demo source).

The server is configured as a binlog CDC source must be: ``log_bin``, ``binlog_format=ROW``,
``binlog_row_image=FULL``, ``binlog_row_metadata=FULL``, a ``server_id``, ``gtid_strict_mode``
(MariaDB always writes GTIDs). It listens on ``127.0.0.1`` only, on a free port, with its
socket and pid file in its own directory; the administrator account
(``root@127.0.0.1``) has a generated password kept beside the data directory.

MariaDB refuses to run as root. When this process is root, ``mariadb-install-db`` and the
server run as the unprivileged ``nobody`` user, which owns the directory, and the directory's
ancestors are made traversable (``o+x``). The server is this process's child, not a daemon:
it gets SIGKILL from the kernel when the thread that started it exits
(``core.process_lifetime``), so it never outlives a killed test session or demo.

Binaries: ``$HEADWATER_MARIADB_BIN`` (one directory holding ``mariadbd`` and
``mariadb-install-db``), else ``PATH`` plus ``/usr/sbin`` (Debian: ``apt-get install
mariadb-server``).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

from core.errors import PermanentError
from core.process_lifetime import parent_death_preexec
from operations.embedded_postgres import free_port

__all__ = ["EmbeddedMariaDB", "EmbeddedMariaDBError", "MariaDBNotInstalledError", "find_mariadb_bin"]

_UNPRIVILEGED_USER = "nobody"
_PASSWORD_FILE = "admin_password"
_PROVISIONED = "admin_created"
_LOG_FILE = "mariadb.log"
_START_TIMEOUT_S = 60
_STOP_TIMEOUT_S = 60
_LOG_TAIL_LINES = 15
_ZONEINFO = Path("/usr/share/zoneinfo")


class EmbeddedMariaDBError(PermanentError):
    """The embedded server could not be initialised, started or stopped; the message carries its log tail."""


class MariaDBNotInstalledError(EmbeddedMariaDBError):
    """``mariadbd`` or ``mariadb-install-db`` was not found."""


def find_mariadb_bin(name: str) -> Path:
    """The path of MariaDB program ``name`` (``mariadbd``, ``mariadb-install-db``, ``mariadb-binlog``...)."""
    override = os.environ.get("HEADWATER_MARIADB_BIN")
    directories = [override] if override else []
    directories += [*os.environ.get("PATH", "").split(os.pathsep), "/usr/sbin", "/usr/bin"]
    for directory in directories:
        if directory and os.access(Path(directory) / name, os.X_OK):
            return Path(directory) / name
    msg = (
        f"MariaDB's {name} was not found on PATH or in /usr/sbin: install the server "
        "(Debian/Ubuntu: apt-get install mariadb-server) or set HEADWATER_MARIADB_BIN to its directory"
    )
    raise MariaDBNotInstalledError(msg)


def _make_traversable(directory: Path) -> None:
    for parent in [directory, *directory.parents]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


class EmbeddedMariaDB:
    """One MariaDB server in ``base_dir`` (``data/`` below it), initialised on first :meth:`start`.

    ``timezone``: the server's ``time_zone`` (a zone name is loaded into its time zone tables
    from the system's zoneinfo at initialisation). ``settings``: extra server options
    (``{"binlog_row_metadata": "MINIMAL"}``), overriding the defaults set here. ``version``:
    the version string the server reports (MariaDB's ``--version=...``), for clients that
    branch on it. ``port`` is chosen free at the first start and kept across restarts.
    """

    host = "127.0.0.1"
    admin = "root"

    def __init__(
        self,
        base_dir: Path,
        *,
        timezone: str = "UTC",
        settings: Mapping[str, str] | None = None,
        server_id: int = 1,
        version: str | None = None,
        port: int | None = None,
    ) -> None:
        self.base_dir = Path(base_dir).absolute()
        self.timezone = timezone
        self.settings = dict(settings or {})
        self.server_id = server_id
        self.version = version
        self._port = port
        self._process: subprocess.Popen[bytes] | None = None

    # -- paths and identity -------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        """The server's data directory (binlogs included)."""
        return self.base_dir / "data"

    @property
    def socket_path(self) -> Path:
        """The server's Unix socket."""
        return self.base_dir / "mysqld.sock"

    @property
    def log_file(self) -> Path:
        """The server's error log."""
        return self.base_dir / _LOG_FILE

    @property
    def port(self) -> int:
        """The TCP port; only known once started."""
        if self._port is None:
            msg = "EmbeddedMariaDB has not been started: call start() first"
            raise EmbeddedMariaDBError(msg)
        return self._port

    @property
    def password(self) -> str:
        """The administrator's password, generated at initialisation."""
        return (self.base_dir / _PASSWORD_FILE).read_text().strip()

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs."""
        return self._process.pid if self.running and self._process is not None else None

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self._process is not None and self._process.poll() is None

    def dsn(self, database: str = "", user: str | None = None, password: str | None = None) -> str:
        """A ``mysql://`` URL; the administrator and its password unless ``user`` is given."""
        if user is None:
            user, password = self.admin, self.password if password is None else password
        auth = quote(user, safe="") + (f":{quote(password, safe='')}" if password is not None else "")
        return f"mysql://{auth}@{self.host}:{self.port}/{quote(database, safe='')}"

    def connect_args(self, database: str | None = None) -> dict[str, Any]:
        """Keyword arguments of ``pymysql.connect`` for the administrator."""
        args: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.admin, "password": self.password}
        if database:
            args["database"] = database
        return args

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        """Initialise if needed and start the server; returns once it accepts connections."""
        if self.running:
            return self
        if not (self.data_dir / "mysql").is_dir():
            self._initialise()
        elif os.geteuid() == 0:
            _make_traversable(self.base_dir.parent)
        if self._port is None:
            self._port = free_port(self.host)
        offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        # A prctl call only between fork and exec (core.process_lifetime): safe with threads.
        self._process = subprocess.Popen(
            [str(find_mariadb_bin("mariadbd")), *self._server_options()],
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self._env(),
            preexec_fn=parent_death_preexec(signal.SIGKILL),  # noqa: PLW1509
            **self._as_service_user(),
        )
        deadline = time.monotonic() + _START_TIMEOUT_S
        try:
            while not self._accepts_connections():
                if self._process.poll() is not None or time.monotonic() > deadline:
                    msg = f"embedded MariaDB failed to start in {self.base_dir}: {' | '.join(self._log_tail(offset))}"
                    raise EmbeddedMariaDBError(msg)
                time.sleep(0.05)
        except BaseException:
            self.kill()
            raise
        return self

    def stop(self) -> None:
        """Shut the server down cleanly (SIGTERM, wait); a no-op when it is not running."""
        process = self._process
        if process is None or process.poll() is not None:
            self._process = None
            return
        process.terminate()
        try:
            process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self._process = None

    def kill(self) -> None:
        """SIGKILL the server (a crash: InnoDB and the binlog recover at the next start)."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        self._process = None

    def restart(self, *, crash: bool = False) -> None:
        """Stop (or ``crash``: SIGKILL) and start again on the same port."""
        if crash:
            self.kill()
        else:
            self.stop()
        self.start()

    def remove(self) -> None:
        """Kill the server and delete its directory."""
        self.kill()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------------

    def _server_options(self) -> list[str]:
        options = {
            "datadir": str(self.data_dir),
            "tmpdir": str(self._tmp_dir()),
            "port": str(self.port),
            "bind_address": self.host,
            "socket": str(self.socket_path),
            "pid_file": str(self.base_dir / "mysqld.pid"),
            "log_error": str(self.log_file),
            "server_id": str(self.server_id),
            "log_bin": str(self.data_dir / "binlog"),
            "binlog_format": "ROW",
            "binlog_row_image": "FULL",
            "binlog_row_metadata": "FULL",
            "gtid_strict_mode": "ON",
            "log_slave_updates": "ON",
            "binlog_expire_logs_seconds": "604800",
            "default_time_zone": self.timezone,
            "character_set_server": "utf8mb4",
            "collation_server": "utf8mb4_general_ci",
            "skip_name_resolve": "ON",
            "performance_schema": "OFF",
            "innodb_buffer_pool_size": "128M",
            "innodb_log_file_size": "64M",
            "max_connections": "200",
            # A throwaway server: a crashed *process* loses nothing (the OS keeps its page cache),
            # only a crashed machine would, and tests never survive that.
            "sync_binlog": "0",
            "innodb_flush_log_at_trx_commit": "2",
            **self.settings,
        }
        args = ["--no-defaults", *(f"--{key.replace('_', '-')}={value}" for key, value in options.items())]
        if self.version:
            args.append(f"--version={self.version}")
        return args

    def _tmp_dir(self) -> Path:
        """The server's own temporary directory, made if missing.

        Servers sharing ``/tmp`` collide: two ``mariadb-install-db`` runs at the same moment
        failed with "Could not remove temporary table /tmp/#sql-temptable-...".
        """
        path = self.base_dir / "tmp"
        if not path.exists():
            path.mkdir(parents=True)
            if os.geteuid() == 0:
                owner = pwd.getpwnam(_UNPRIVILEGED_USER)
                shutil.chown(path, owner.pw_uid, owner.pw_gid)
        return path

    def _initialise(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        password_file = self.base_dir / _PASSWORD_FILE
        password_file.write_text(secrets.token_urlsafe(18) + "\n")
        password_file.chmod(0o600)
        if os.geteuid() == 0:
            _make_traversable(self.base_dir.parent)
            owner = pwd.getpwnam(_UNPRIVILEGED_USER)
            shutil.chown(self.base_dir, owner.pw_uid, owner.pw_gid)
        self._run(
            [
                str(find_mariadb_bin("mariadb-install-db")),
                "--no-defaults",
                f"--datadir={self.data_dir}",
                f"--tmpdir={self._tmp_dir()}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                *([f"--user={_UNPRIVILEGED_USER}"] if os.geteuid() == 0 else []),
            ],
            action="initialise (mariadb-install-db)",
        )
        # The time zone tables are filled before the first start (a server whose default_time_zone
        # names a zone it has no rows for refuses to start); the administrator is created at the
        # first start (bootstrap mode skips the grant tables).
        self._run(
            [
                str(find_mariadb_bin("mariadbd")),
                "--no-defaults",
                f"--datadir={self.data_dir}",
                f"--tmpdir={self._tmp_dir()}",
                "--bootstrap",
                "--skip-log-bin",
                *([f"--user={_UNPRIVILEGED_USER}"] if os.geteuid() == 0 else []),
            ],
            action="initialise (time zones)",
            stdin="USE mysql;\n" + self._zone_sql() + "\n",
        )

    def _zone_sql(self) -> str:
        """The time zone tables' rows for ``self.timezone`` (nothing for an offset like ``+05:45``)."""
        if self.timezone.startswith(("+", "-")) or self.timezone in ("SYSTEM", "UTC"):
            zones = ["UTC"]
        else:
            zones = ["UTC", self.timezone]
        parts = []
        for zone in zones:
            result = subprocess.run(
                [str(find_mariadb_bin("mariadb-tzinfo-to-sql")), str(_ZONEINFO / zone), zone],
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                msg = f"embedded MariaDB: cannot load time zone {zone!r} from {_ZONEINFO}: {result.stderr.strip()}"
                raise EmbeddedMariaDBError(msg)
            parts.append(result.stdout)
        return "\n".join(parts)

    def _run(self, args: list[str], *, action: str, stdin: str | None = None) -> None:
        result = subprocess.run(
            args,
            cwd="/",
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            env=self._env(),
        )
        if result.returncode != 0:
            output = (result.stderr or result.stdout).strip().splitlines()[-_LOG_TAIL_LINES:]
            msg = f"embedded MariaDB failed to {action} in {self.base_dir}: {' | '.join(output)}"
            raise EmbeddedMariaDBError(msg)

    def _accepts_connections(self) -> bool:
        import pymysql

        provisioned = self.base_dir / _PROVISIONED
        try:
            if provisioned.exists():
                pymysql.connect(**self.connect_args(), connect_timeout=2).close()
                return True
            # First start: root@localhost has no password yet and answers on the socket only.
            conn = pymysql.connect(unix_socket=str(self.socket_path), user=self.admin, connect_timeout=2)
        except pymysql.err.OperationalError:
            return False
        with conn, conn.cursor() as cur:
            for statement in (
                f"CREATE USER IF NOT EXISTS '{self.admin}'@'{self.host}'",
                f"ALTER USER '{self.admin}'@'{self.host}' IDENTIFIED BY %s",
                f"GRANT ALL PRIVILEGES ON *.* TO '{self.admin}'@'{self.host}' WITH GRANT OPTION",
                f"ALTER USER '{self.admin}'@'localhost' IDENTIFIED BY %s",
            ):
                cur.execute(statement, (self.password,) if "%s" in statement else None)
        provisioned.touch()
        return True

    def _as_service_user(self) -> dict[str, Any]:
        if os.geteuid() != 0:
            return {}
        owner = pwd.getpwnam(_UNPRIVILEGED_USER)
        return {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MYSQL", "MARIADB"))}
        env.update(LC_ALL="C.UTF-8", LANG="C.UTF-8", TZ="UTC")
        return env

    def _log_tail(self, offset: int) -> list[str]:
        try:
            with self.log_file.open("rb") as log:
                log.seek(offset)
                lines = log.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return []
        return lines[-_LOG_TAIL_LINES:]

    def __repr__(self) -> str:
        return f"EmbeddedMariaDB({str(self.base_dir)!r}, port={self._port}, running={self.running})"
