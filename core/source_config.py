"""The ``sources:`` section of ``headwater.yaml``: connection, tables, keys, column policies, filters, signals."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from core.config_model import ConfigModel

HashAlgorithm = Literal["sha256", "sha512", "sha384", "sha1", "md5"]
#: Default of ``sources.<name>.spill_threshold_bytes``.
SPILL_THRESHOLD_BYTES = 64 << 20


class TypesConfig(ConfigModel):
    """Debezium-style type handling modes for captured values."""

    decimal_handling_mode: Literal["string", "precise", "double"] = "string"
    time_precision_mode: Literal["adaptive", "connect"] = "adaptive"
    binary_handling_mode: Literal["base64", "hex"] = "base64"
    #: kind mysql: unsigned BIGINT as a Java long (``long``, wrapping past 2^63-1) or a Decimal (``precise``).
    bigint_unsigned_handling_mode: Literal["long", "precise"] = "long"


def _column_path(name: str) -> str:
    if name.count(".") < 2 or not all(name.split(".")):
        msg = f"{name!r} must be written schema.table.column"
        raise ValueError(msg)
    return name


def _table_path(name: str) -> str:
    if name.count(".") != 1 or not all(name.split(".")):
        msg = f"{name!r} must be written schema.table"
        raise ValueError(msg)
    return name


def column_table(column: str) -> str:
    """``schema.table`` of a ``schema.table.column`` name (the column name may hold dots)."""
    schema, table, _column = column.split(".", 2)
    return f"{schema}.{table}"


class MaskConfig(ConfigModel):
    """How one column's values are masked: exactly one of ``hash`` (with ``salt``), ``truncate``, ``replace``.

    ``hash`` follows Debezium's ``column.mask.hash.v2`` (``version: 2``, the default) or
    ``column.mask.hash`` (``version: 1``): the lowercase hex digest of the salt's UTF-8 bytes
    followed by the value's (version 2: its UTF-8 text; version 1: its Java serialization), cut
    to the length of a ``varchar(n)``/``char(n)`` column. ``truncate`` keeps the first N
    characters, ``replace`` puts a fixed string in place of every value. NULL stays NULL.
    """

    hash: HashAlgorithm | None = None
    salt: SecretStr | None = None
    version: Literal[1, 2] = 2
    truncate: int | None = Field(default=None, ge=0)
    replace: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> MaskConfig:
        kinds = [k for k in ("hash", "truncate", "replace") if getattr(self, k) is not None]
        if len(kinds) != 1:
            msg = "give exactly one of 'hash' (with 'salt'), 'truncate' or 'replace'"
            raise ValueError(msg)
        if self.hash is not None and self.salt is None:
            msg = "a hash mask needs a 'salt' (use ${VAR}: the salt is a secret)"
            raise ValueError(msg)
        if self.hash is None and (self.salt is not None or "version" in self.model_fields_set):
            msg = "'salt' and 'version' belong to a hash mask"
            raise ValueError(msg)
        return self

    @property
    def kind(self) -> Literal["hash", "truncate", "replace"]:
        """Which mask this is."""
        return "hash" if self.hash is not None else "truncate" if self.truncate is not None else "replace"


class ColumnsConfig(ConfigModel):
    """Which columns are captured, and how some are masked (names ``schema.table.column``).

    ``include`` lists the only columns captured of the tables it names (other tables keep
    every column); ``exclude`` lists columns never captured; ``mask`` the columns whose values
    are masked before they leave the agent. Excluded and masked values are never written
    anywhere (events, quarantine, schema records, errors, logs).
    """

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    mask: dict[str, MaskConfig] = {}

    @field_validator("include", "exclude")
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            _column_path(name)
        return value

    @field_validator("mask")
    @classmethod
    def _mask_names(cls, value: dict[str, MaskConfig]) -> dict[str, MaskConfig]:
        for name in value:
            _column_path(name)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ColumnsConfig:
        both = sorted({column_table(c) for c in self.include} & {column_table(c) for c in self.exclude})
        if both:
            msg = f"table {both[0]} is in both 'include' and 'exclude': list its columns in one of them"
            raise ValueError(msg)
        dropped = [c for c in self.mask if c in self.exclude]
        if dropped:
            msg = f"{dropped[0]} is both masked and excluded: an excluded column is never captured, drop its mask"
            raise ValueError(msg)
        included = {column_table(c) for c in self.include}
        outside = [c for c in self.mask if column_table(c) in included and c not in self.include]
        if outside:
            msg = f"{outside[0]} is masked but not in 'include' for its table, so it is never captured"
            raise ValueError(msg)
        return self

    def captures(self, table: str, column: str) -> bool:
        """Whether ``column`` of ``table`` (``schema.table``) is captured."""
        qualified = f"{table}.{column}"
        if qualified in self.exclude:
            return False
        if not self.include:
            return True
        return qualified in self.include or all(column_table(c) != table for c in self.include)


#: Debezium's ``skipped.operations`` letters: create, update, delete, truncate.
SkippedOperation = Literal["c", "u", "d", "t"]


#: ``password`` / ``sslpassword`` given as URL query parameters (libpq accepts every keyword there).
_QUERY_SECRET = re.compile(r"([?&](?:ssl)?password=)[^&#]*", re.IGNORECASE)
#: ``password=...`` / ``sslpassword=...`` in the key=value form, quoted or not.
_KEYWORD_SECRET = re.compile(r"((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def redact_dsn(dsn: str) -> str:
    """Return ``dsn`` with every password replaced by ``***`` (URL or key=value form); never raises.

    Masks the URL's userinfo password and ``password`` / ``sslpassword`` parameters. The
    userinfo is taken up to the last ``@`` before the path, so a password holding an
    unencoded ``@`` or ``:`` is masked whole; multi-host and IPv6 host lists stay as written.
    """
    if "://" in dsn:
        scheme, separator, rest = dsn.partition("://")
        slash = rest.find("/")
        authority, tail = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
        userinfo, at, hosts = authority.rpartition("@")
        if at and ":" in userinfo:
            authority = f"{userinfo.split(':', 1)[0]}:***@{hosts}"
        return scheme + separator + _QUERY_SECRET.sub(r"\1***", authority + tail)
    return _KEYWORD_SECRET.sub(r"\1***", dsn)


class SourceConfig(ConfigModel):
    """One registered source database; ``kind`` names its source kind (``capture.kinds``)."""

    #: The source kind (``postgres``, the default); known kinds are checked where capture uses them.
    kind: str = Field(default="postgres", pattern=r"^[a-z][a-z0-9_]*$")
    dsn: SecretStr
    tables: tuple[str, ...] | None = None
    schemas: tuple[str, ...] | None = None
    snapshot: Literal["initial", "never", "when_needed", "initial_only"] = "initial"
    heartbeat_interval_s: float = Field(default=10.0, gt=0)
    slot: str | None = None
    publication: str | None = None
    #: kind mysql: the replica id capture registers with (unique among the server's replicas).
    server_id: int | None = Field(default=None, ge=1, le=2**32 - 1)
    types: TypesConfig = TypesConfig()
    columns: ColumnsConfig = ColumnsConfig()
    #: The record key of a table (``schema.table`` -> columns) instead of its primary key, as
    #: Debezium's ``message.key.columns``; a table without a primary key needs one to be loaded.
    keys: dict[str, tuple[str, ...]] = {}
    #: Rows captured of a table (``schema.table`` -> SQL condition), streaming (a publication row
    #: filter, PostgreSQL 15+) and every snapshot alike.
    filters: dict[str, str] = {}
    #: Change operations not written to the log (Debezium's ``skipped.operations``).
    skipped_operations: tuple[SkippedOperation, ...] = ()
    #: BEGIN/END records of every transaction in ``<source>.transaction`` (Debezium's
    #: ``provide.transaction.metadata``).
    transactions: bool = False
    #: A table whose inserted rows (``id``, ``type``, ``data``) are signals to the agent, as
    #: Debezium's ``signal.data.collection``.
    signal_table: str | None = None
    #: Memory the changes of open transactions may hold (estimated as decoded); past it a growing
    #: transaction's further changes spill to ``capture/<source>/spill/`` (:mod:`capture.spill`).
    spill_threshold_bytes: int = Field(default=SPILL_THRESHOLD_BYTES, ge=1 << 20)
    #: kind mysql, no longer used: it bounded a transaction MySQL capture held whole in memory;
    #: large transactions spill now (``spill_threshold_bytes``). Accepted so old configs load
    #: (capture warns once that it is ignored).
    max_transaction_bytes: int | None = None

    @field_validator("keys")
    @classmethod
    def _keys_name_tables(cls, value: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for table, columns in value.items():
            _table_path(table)
            if not columns or len(set(columns)) != len(columns):
                msg = f"{table}: give one or more distinct key columns"
                raise ValueError(msg)
        return value

    @field_validator("filters")
    @classmethod
    def _filters_name_tables(cls, value: dict[str, str]) -> dict[str, str]:
        for table, condition in value.items():
            _table_path(table)
            if not condition.strip():
                msg = f"{table}: the filter is empty; give an SQL condition or remove the entry"
                raise ValueError(msg)
        return value

    @field_validator("signal_table")
    @classmethod
    def _signal_table_name(cls, value: str | None) -> str | None:
        return None if value is None else _table_path(value)

    @field_validator("skipped_operations")
    @classmethod
    def _distinct_operations(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            msg = "list each operation once"
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _tables_or_schemas(self) -> SourceConfig:
        if (self.tables is None) == (self.schemas is None):
            msg = "give exactly one of 'tables' or 'schemas'"
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _keys_not_dropped(self) -> SourceConfig:
        for table, columns in self.keys.items():
            for column in columns:
                if not self.columns.captures(table, column):
                    msg = f"keys: {table}: key column {column!r} is not captured (columns.include/exclude)"
                    raise ValueError(msg)
                mask = self.columns.mask.get(f"{table}.{column}")
                if mask is not None and mask.kind != "hash":
                    msg = (
                        f"keys: {table}: key column {column!r} has a {mask.kind} mask, which would merge distinct "
                        "keys; mask it with a hash or choose another key"
                    )
                    raise ValueError(msg)
        return self

    @property
    def dsn_redacted(self) -> str:
        """The DSN with its password masked, safe for logs and output."""
        return redact_dsn(self.dsn.get_secret_value())
