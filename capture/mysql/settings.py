"""One MySQL/MariaDB source as capture runs it: where, as whom, which tables, how values are written.

Built from a ``mysql://user:password@host:port/[database]`` DSN (the password is never printed:
:meth:`MySqlSource.redacted_dsn`). ``tables`` are ``database.table`` names. ``server_id`` is the
replica id capture registers with: unique among the server's replicas, so by default derived
from the source's name (a stable value in 1e6..2^31).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from capture.mysql.binlog.client import ServerAddress
from capture.mysql.types.values import TypeModes
from core.errors import PermanentError
from core.source_config import SPILL_THRESHOLD_BYTES, ColumnsConfig

_DEFAULT_PORT = 3306
_DEFAULT_MODES = TypeModes()


class MySqlSettingsError(PermanentError):
    """A MySQL source setting that cannot be used (the message names it and what to write)."""


def default_server_id(source: str) -> int:
    """A replica id for ``source`` unlikely to collide with real replicas (1,000,000 .. 2^31-1)."""
    return 1_000_000 + zlib.crc32(source.encode()) % (2**31 - 1_000_001)


def parse_dsn(dsn: str) -> tuple[ServerAddress, str]:
    """``mysql://user:password@host:port/database`` -> the server address and the database ("" if none)."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("mysql", "mariadb"):
        msg = "a MySQL source's dsn must start with mysql:// (mysql://user:password@host:3306/database)"
        raise MySqlSettingsError(msg)
    try:
        port = parts.port or _DEFAULT_PORT
    except ValueError:
        msg = "the dsn's port is not a number (mysql://user:password@host:3306/database)"
        raise MySqlSettingsError(msg) from None
    if not parts.hostname or not parts.username:
        msg = "the dsn needs a user and a host (mysql://user:password@host:3306/database)"
        raise MySqlSettingsError(msg)
    address = ServerAddress(parts.hostname, port, unquote(parts.username), unquote(parts.password or ""))
    return address, unquote(parts.path.lstrip("/"))


@dataclass(frozen=True)
class MySqlSource:
    """What one MySQL capture agent needs."""

    name: str
    address: ServerAddress
    tables: tuple[str, ...]
    modes: TypeModes = _DEFAULT_MODES
    server_id: int = 0
    heartbeat_s: float = 5.0
    #: ``initial``: read every table before streaming (first run); ``never``: stream from the binlog's end.
    snapshot: str = "initial"
    #: BEGIN/END records per transaction in ``<source>.transaction`` (Debezium's transaction metadata).
    transactions: bool = False
    #: ``schemas:``: databases captured whole, tables created later included.
    databases: tuple[str, ...] = ()
    columns: ColumnsConfig = field(default_factory=ColumnsConfig)
    #: ``database.table`` -> the record key's columns (instead of the primary key).
    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: ``database.table`` -> the condition a row must meet to be captured (:mod:`capture.mysql.row_filter`).
    filters: Mapping[str, str] = field(default_factory=dict)
    #: Debezium's ``skipped.operations``: ``c``, ``u``, ``d``, ``t``.
    skipped_operations: tuple[str, ...] = ()
    #: Estimated memory of decoded changes an open transaction may hold; past it its row events spill to disk.
    spill_threshold_bytes: int = SPILL_THRESHOLD_BYTES
    #: ``database.table`` whose inserts are signals (:mod:`capture.mysql.signals`); None: no signal table.
    signal_table: str | None = None

    @classmethod
    def from_dsn(
        cls,
        name: str,
        dsn: str,
        tables: tuple[str, ...],
        *,
        modes: TypeModes = _DEFAULT_MODES,
        server_id: int = 0,
        snapshot: str = "initial",
        transactions: bool = False,
        **settings: object,
    ) -> MySqlSource:
        """A source from its DSN; a table without a database takes the DSN's; ``settings``: the other fields."""
        address, database = parse_dsn(dsn)
        qualified = []
        for table in tables:
            if "." not in table and not database:
                msg = f"table {table!r} names no database and the dsn has none: write it as database.table"
                raise MySqlSettingsError(msg)
            qualified.append(table if "." in table else f"{database}.{table}")
        if snapshot not in ("initial", "never"):
            msg = f"snapshot must be 'initial' or 'never' for a MySQL source, got {snapshot!r}"
            raise MySqlSettingsError(msg)
        return cls(
            name,
            address,
            tuple(qualified),
            modes,
            server_id or default_server_id(name),
            snapshot=snapshot,
            transactions=transactions,
            **settings,  # type: ignore[arg-type]  # the other fields, by name
        )

    def wants(self, database: str, table: str) -> bool:
        """True when ``database.table`` is captured (listed, or in a database captured whole)."""
        return database in self.databases or f"{database}.{table}" in self.tables

    def redacted_dsn(self) -> str:
        """The DSN without its password."""
        return f"mysql://{self.address.user}:***@{self.address.host}:{self.address.port}/"
