"""Replica tables: created from a topic's schema records, evolved when the topic's shape changes.

A topic's replica is ``<options.schema>.<options.table>`` (the template names ``{topic}``,
``{source}``, ``{schema}``, ``{table}``), with the topic's columns (every version's, latest
first: a column dropped at the source stays, null in rows written after), typed by
:mod:`sinks.postgres.columns`, its key (``_headwater.schemas``) as the primary key, and each
row's source position (:mod:`sinks.postgres.truncates`). When an
event shows a column the replica lacks, or a row no longer fits a column's type, the schema
records are read again: new columns are added, changed types altered (``USING col::type``).
A topic without a key, a key that changed, or a column that cannot be written exactly stops the
sink with one line naming what to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from psycopg import sql

from core.config import ProjectConfig
from core.sink_config import PostgresOptions
from core.source_config import TypesConfig
from log.base import Log
from log.table_schemas import column_type as logical_column_type
from log.table_schemas import read_schema_records, schema_key
from sinks.errors import SinkConfigError
from sinks.postgres.columns import Convert, UnwritableColumnError, column_type, converter, native_kind, same
from sinks.postgres.truncates import INDEX_COLUMN, LSN_COLUMN
from sinks.records import topic_fields

#: ``format_type`` spellings of the short names :func:`column_type` uses.
_CANONICAL = {
    "timestamptz": "timestamp with time zone",
    "timestamp": "timestamp without time zone",
    "time": "time without time zone",
    "timetz": "time with time zone",
}


def _canonical(type_name: str) -> str:
    base, array = (type_name[:-2], "[]") if type_name.endswith("[]") else (type_name, "")
    return _CANONICAL.get(base, base) + array


@dataclass
class ReplicaTable:
    """One topic's replica: its name, key and columns (name -> SQL type and converter), in table order."""

    topic: str
    schema: str
    name: str
    key: tuple[str, ...]
    types: dict[str, str] = field(default_factory=dict)
    converters: dict[str, Convert] = field(default_factory=dict)
    #: The columns' names (UTF-8) and codes for ``native/sink_rows.c``'s COPY text, in table
    #: order; None when a column needs its Python converter.
    native: tuple[list[bytes], bytes] | None = None

    @property
    def identifier(self) -> sql.Identifier:
        """``"schema"."name"``."""
        return sql.Identifier(self.schema, self.name)

    @property
    def qualified(self) -> str:
        """``schema.name`` as text (the key of its truncates)."""
        return f"{self.schema}.{self.name}"


class ReplicaTables:
    """The replica of every topic a PostgreSQL sink met, created and evolved on demand."""

    def __init__(
        self, sink: str, options: PostgresOptions, fields: Sequence[str] | None, config: ProjectConfig, log: Log
    ) -> None:
        self._sink = sink
        self._options = options
        self._fields = fields
        self._config = config
        self._log = log
        self._tables: dict[str, ReplicaTable] = {}

    def forget(self) -> None:
        """Drop what is known of the replicas (after a rollback undid DDL of this transaction)."""
        self._tables.clear()

    def get(self, conn: Any, topic: str, columns: Iterable[str]) -> ReplicaTable:
        """The replica of ``topic``, made to hold ``columns`` (a row's column names)."""
        table = self._tables.get(topic)
        wanted = [c for c in columns if self._fields is None or c in self._fields or c.startswith("__hw_")]
        if table is None or any(c not in table.types for c in wanted):
            table = self.refresh(conn, topic)
        return table

    def refresh(self, conn: Any, topic: str) -> ReplicaTable:
        """Read ``topic``'s schema records again and bring the replica in line (create, add, alter)."""
        versions = read_schema_records(self._log, [topic]).get(topic, [])
        if not versions:
            self._refuse(f"topic {topic} has no schema record (not a captured table or feed); leave it out of from:")
        ordered = sorted(versions, key=lambda record: int(record.get("version", 0)))
        key = schema_key(ordered[-1])
        if not key:
            self._refuse(f"topic {topic} has no key; a replica keeps rows by key (give the table a primary key)")
        assert key is not None
        modes = self._modes(topic)
        wanted: dict[str, tuple[str, Convert]] = {}
        native: dict[str, str | None] = {LSN_COLUMN: "L", INDEX_COLUMN: "X"}
        for record in reversed(ordered):  # latest version first; dropped columns after
            for column in record["columns"]:
                name = column["name"]
                if name in wanted or (self._fields is not None and name not in self._fields and name not in key):
                    continue
                logical = logical_column_type(column, modes)
                try:
                    wanted[name] = (column_type(logical, int(column.get("type_oid", 0))), converter(logical))
                    native[name] = native_kind(logical)
                except UnwritableColumnError as exc:
                    self._refuse(f"column {name} of topic {topic} is {exc}; leave it out with transform.fields")
        wanted[LSN_COLUMN] = ("bigint", same)
        wanted[INDEX_COLUMN] = ("integer", same)
        names = topic_fields(topic)
        table = ReplicaTable(topic, self._options.schema_, self._options.table.format(**names), key)
        known = self._tables.get(topic)
        if known is not None and known.key != key:
            self._refuse(
                f"the key of topic {topic} changed from {', '.join(known.key)} to {', '.join(key)}; "
                f"drop the replica table {table.schema}.{table.name} and replay the sink from offset 0"
            )
        self._apply_ddl(conn, table, wanted)
        table.types = {name: type_name for name, (type_name, _) in wanted.items()}
        table.converters = {name: convert for name, (_, convert) in wanted.items()}
        codes = [native[name] for name in wanted]
        if all(codes):
            table.native = [name.encode() for name in wanted], "".join(cast(list[str], codes)).encode()
        self._tables[topic] = table
        return table

    def _apply_ddl(self, conn: Any, table: ReplicaTable, wanted: Mapping[str, tuple[str, Convert]]) -> None:
        existing = dict(
            conn.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped",
                (table.schema, table.name),
            ).fetchall()
        )
        if not existing:
            columns = [sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, (t, _) in wanted.items()]
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(table.schema)))
            conn.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(
                    table.identifier,
                    sql.SQL(", ").join(columns),
                    sql.SQL(", ").join(sql.Identifier(k) for k in table.key),
                )
            )
            return
        for name, (type_name, _) in wanted.items():
            if name not in existing:
                conn.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                        table.identifier, sql.Identifier(name), sql.SQL(type_name)
                    )
                )
            elif _canonical(existing[name]) != _canonical(type_name):
                conn.execute(
                    sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {} USING {}::{}").format(
                        table.identifier,
                        sql.Identifier(name),
                        sql.SQL(type_name),
                        sql.Identifier(name),
                        sql.SQL(type_name),
                    )
                )

    def _modes(self, topic: str) -> TypesConfig:
        source = self._config.sources.get(topic.split(".", 1)[0])
        return source.types if source is not None else TypesConfig()

    def _refuse(self, detail: str) -> None:
        raise SinkConfigError(self._sink, detail)
