"""What a MySQL/MariaDB server and account must offer before capture starts, each miss with its one-line fix.

:func:`evaluate` is pure (server variables in, problems and warnings out); :func:`check` reads the
variables and tries what the account must be allowed to do: ``SHOW MASTER STATUS`` (REPLICATION
CLIENT; MariaDB calls it BINLOG MONITOR), a binlog dump from the current end (REPLICATION SLAVE),
``SELECT`` on every captured table, and a consistent-snapshot transaction. Trying is exact where
reading grants is not (roles, wildcards, proxies). Nothing is created or changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pymysql

from capture.mysql.binlog.client import BinlogStream, BinlogStreamError, ServerAddress
from capture.mysql.binlog.position import BinlogPosition
from core.errors import HeadwaterError

#: Binlogs kept for less than this are a warning: capture stopped longer needs a resync.
MIN_RETENTION_S = 24 * 3600
_PERSIST = "and in the server's config file"


@dataclass(frozen=True)
class ServerFacts:
    """What :func:`evaluate` decides from: the server's variables (lower-case names) and flavour."""

    variables: Mapping[str, str]

    @property
    def mariadb(self) -> bool:
        """A MariaDB server (its version says so)."""
        return "mariadb" in self.variables.get("version", "").lower()

    def get(self, name: str) -> str | None:
        """A variable's value, or None when the server has no such variable."""
        return self.variables.get(name)


@dataclass
class Findings:
    """Problems (capture cannot run) and warnings (it runs, but an operator should know)."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _setting(name: str, value: str, restart: bool = False) -> str:
    if restart:
        return f"set {name}={value} in the server's config file and restart it"
    return f"SET GLOBAL {name} = '{value}' {_PERSIST}"


def retention_seconds(facts: ServerFacts) -> int | None:
    """How long the server keeps binlogs (None: forever)."""
    seconds = facts.get("binlog_expire_logs_seconds")
    if seconds not in (None, "", "0"):
        return int(float(seconds or 0))
    days = facts.get("expire_logs_days")
    if days not in (None, "", "0"):
        return int(float(days or 0) * 86400)
    return None


def evaluate(facts: ServerFacts) -> Findings:
    """The server-side prerequisites (variables only; privileges are tried by :func:`check`)."""
    found = Findings()
    problem = found.problems.append
    if facts.get("log_bin") not in ("1", "ON"):
        problem(f"binary logging is off: {_setting('log_bin', 'ON', restart=True)} (e.g. log-bin=mysql-bin)")
    if (facts.get("binlog_format") or "").upper() != "ROW":
        problem(f"binlog_format is {facts.get('binlog_format')}, capture needs ROW: {_setting('binlog_format', 'ROW')}")
    if (facts.get("binlog_row_image") or "").upper() != "FULL":
        problem(
            f"binlog_row_image is {facts.get('binlog_row_image')}, capture needs FULL: "
            f"{_setting('binlog_row_image', 'FULL')}"
        )
    metadata = facts.get("binlog_row_metadata")
    if metadata is None:
        problem(
            "the server has no binlog_row_metadata (MariaDB < 10.5 or MySQL < 8.0.1): its binlog does not name "
            "columns; upgrade the server"
        )
    elif metadata.upper() != "FULL":
        problem(f"binlog_row_metadata is {metadata}, capture needs FULL: {_setting('binlog_row_metadata', 'FULL')}")
    if facts.get("server_id") in (None, "0"):
        problem("server_id is 0: give the server a unique non-zero server_id in its config file and restart it")
    for name in ("log_bin_compress", "binlog_transaction_compression"):
        if facts.get(name) in ("1", "ON"):
            problem(f"{name} is ON: capture cannot read compressed binlog events; {_setting(name, 'OFF')}")
    if not facts.mariadb and facts.get("gtid_mode") not in ("ON", None):
        found.warnings.append(
            f"gtid_mode is {facts.get('gtid_mode')}: capture resumes by binlog file and position only; "
            "set gtid_mode=ON and enforce_gtid_consistency=ON to resume by GTID"
        )
    retention = retention_seconds(facts)
    if retention is not None and retention < MIN_RETENTION_S:
        found.warnings.append(
            f"binlogs are kept only {retention // 3600} h {retention % 3600 // 60} min: capture stopped longer "
            "than that needs `headwater source resync`; raise binlog_expire_logs_seconds to 604800 (7 days) or more"
        )
    return found


_VARIABLES = (
    "version",
    "log_bin",
    "binlog_format",
    "binlog_row_image",
    "binlog_row_metadata",
    "server_id",
    "log_bin_compress",
    "binlog_transaction_compression",
    "gtid_mode",
    "binlog_expire_logs_seconds",
    "expire_logs_days",
)


def server_facts(conn: Any) -> ServerFacts:
    """Read the variables :func:`evaluate` needs."""
    names = ", ".join(f"'{name}'" for name in _VARIABLES)
    with conn.cursor() as cur:
        cur.execute(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({names})")
        variables = {str(name).lower(): str(value) for name, value in cur.fetchall()}
    return ServerFacts(variables)


def _denied(exc: pymysql.err.MySQLError) -> bool:
    return bool(exc.args) and exc.args[0] in (1044, 1045, 1142, 1143, 1227, 1370)


def check(address: ServerAddress, tables: Sequence[str], *, server_id: int, databases: Sequence[str] = ()) -> Findings:
    """Every prerequisite of capturing ``tables`` (``db.table``) and ``databases`` (whole) as ``address.user``."""
    with address.connect() as conn:
        facts = server_facts(conn)
        found = evaluate(facts)
        problem = found.problems.append
        client = "BINLOG MONITOR" if facts.mariadb else "REPLICATION CLIENT"
        start: BinlogPosition | None = None
        with conn.cursor() as cur:
            try:
                cur.execute("SHOW MASTER STATUS")
                row = cur.fetchone()
                if row:
                    start = BinlogPosition(str(row[0]), int(row[1]))
            except pymysql.err.MySQLError as exc:
                if not _denied(exc):
                    raise
                problem(f"{address.user} may not read the binlog position: GRANT {client} ON *.* TO {address.user}")
            for table in tables:
                database, _, name = table.partition(".")
                try:
                    cur.execute(f"SELECT 1 FROM `{database}`.`{name}` LIMIT 0")
                    cur.fetchall()
                except pymysql.err.MySQLError as exc:
                    if exc.args and exc.args[0] == 1146:
                        problem(f"table {table} does not exist: create it, or leave it out of --tables")
                    elif _denied(exc):
                        problem(
                            f"{address.user} may not read {table}: "
                            f"GRANT SELECT ON `{database}`.`{name}` TO {address.user}"
                        )
                    else:
                        raise
            for database in databases:
                cur.execute("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (database,))
                if not cur.fetchone()[0]:
                    problem(
                        f"database {database} does not exist, or {address.user} may not see it: "
                        f"GRANT SELECT ON `{database}`.* TO {address.user}"
                    )
    if start is not None and not found.problems:
        _try_binlog_dump(address, start, server_id, found)
    return found


def _try_binlog_dump(address: ServerAddress, start: BinlogPosition, server_id: int, found: Findings) -> None:
    """A non-blocking dump from the binlog's end: refused without REPLICATION SLAVE."""
    try:
        for _ in BinlogStream(address, server_id=server_id, start=start, blocking=False).events():
            pass
    except (BinlogStreamError, HeadwaterError) as exc:
        if "1227" in str(exc) or "denied" in str(exc).lower():
            found.problems.append(
                f"{address.user} may not read the binlog: GRANT REPLICATION SLAVE ON *.* TO {address.user}"
            )
        else:
            raise
