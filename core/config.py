"""The ``headwater.yaml`` project model, validated once at load (keys documented in the README).

Key names are a public contract. Every model is frozen and rejects unknown keys, so
a typo is an error that names its field path instead of a silently ignored setting.
DSN and Kafka passwords are :class:`pydantic.SecretStr`: ``repr``/``str`` never show them.
"""

from __future__ import annotations

import graphlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from core.deployment import SettingsMap, SparkConfig
from core.errors import ConfigError

CONFIG_ENV_VAR = "HEADWATER_CONFIG"
DEFAULT_CONFIG_NAME = "headwater.yaml"

_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class KafkaConfig(_Model):
    """Connection settings of the ``kafka`` log backend; security settings pass through to the client."""

    bootstrap_servers: str = "localhost:9092"
    client: Literal["kafka-python", "confluent-kafka"] = "kafka-python"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None


class FileLogConfig(_Model):
    """Settings of the embedded ``file`` log backend."""

    fsync: Literal["always", "never"] = "always"
    segment_bytes: int = Field(default=128 * 1024 * 1024, gt=0)
    #: Records sections of appended batches stored zstd-compressed (when smaller) or plain.
    compression: Literal["none", "zstd"] = "zstd"
    #: ``<home>/log`` is on a filesystem every Spark node mounts at the same path, so executors
    #: of a cluster (``spark.master`` not local) can read it; without it such a master is refused.
    shared: bool = False


#: A ``log.topics`` key: a topic name, or a glob of one (``*``, ``?``, ``[...]``).
_TOPIC_PATTERN = re.compile(r"^[A-Za-z0-9._\-*?\[\]!]{1,249}$")


class TopicCleaningConfig(_Model):
    """How the cleaner treats the topics one ``log.topics`` key matches; an unset key keeps the topic's own.

    Kafka's topic configs under their names: ``cleanup`` is ``cleanup.policy``;
    ``retention_ms`` / ``retention_bytes`` of -1 keep records forever.
    """

    cleanup: Literal["compact", "delete", "compact,delete"] | None = None
    retention_ms: int | None = Field(default=None, ge=-1)
    retention_bytes: int | None = Field(default=None, ge=-1)
    min_compaction_lag_ms: int | None = Field(default=None, ge=0)
    delete_retention_ms: int | None = Field(default=None, ge=0)
    segment_bytes: int | None = Field(default=None, ge=1024)

    @field_validator("cleanup", mode="before")
    @classmethod
    def _either_order(cls, value: Any) -> Any:
        if isinstance(value, str) and set(value.replace(" ", "").split(",")) == {"compact", "delete"}:
            return "compact,delete"
        return value

    @model_validator(mode="after")
    def _retention_needs_delete(self) -> TopicCleaningConfig:
        limited = {self.retention_ms, self.retention_bytes} - {None, -1}
        if self.cleanup == "compact" and limited:
            msg = "retention_ms and retention_bytes apply only with cleanup 'delete' or 'compact,delete'"
            raise ValueError(msg)
        return self


class LogConfig(_Model):
    """Which log backend stores topics, its defaults for new topics, and how topics are cleaned."""

    backend: Literal["file", "kafka"] = "file"
    partitions: int = Field(default=3, ge=1, le=1024)
    min_compaction_lag_s: int = Field(default=7 * 24 * 3600, ge=0)
    delete_retention_s: int = Field(default=24 * 3600, ge=0)
    kafka: KafkaConfig = KafkaConfig()
    file: FileLogConfig = FileLogConfig()
    #: Per topic name or glob: cleaning that replaces the topic's own (the exact name wins, else the first glob).
    topics: dict[str, TopicCleaningConfig] = {}
    #: How often the background cleaner (``capture --follow``, ``run --follow``, ``log clean --follow``) looks.
    cleaner_interval_s: float = Field(default=60.0, gt=0)

    @field_validator("topics")
    @classmethod
    def _topic_patterns(cls, value: dict[str, TopicCleaningConfig]) -> dict[str, TopicCleaningConfig]:
        for pattern in value:
            if not _TOPIC_PATTERN.match(pattern):
                msg = f"{pattern!r} is not a topic name or glob (A-Z a-z 0-9 . _ - and * ? [ ])"
                raise ValueError(msg)
        return value


class TypesConfig(_Model):
    """Debezium-style type handling modes for captured values."""

    decimal_handling_mode: Literal["string", "precise", "double"] = "string"
    time_precision_mode: Literal["adaptive", "connect"] = "adaptive"
    binary_handling_mode: Literal["base64", "hex"] = "base64"


#: Hash algorithms of a column mask (Debezium's ``column.mask.hash.<algorithm>``: the JCA name without dash).
HashAlgorithm = Literal["sha256", "sha512", "sha384", "sha1", "md5"]


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


class MaskConfig(_Model):
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


class ColumnsConfig(_Model):
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


class SourceConfig(_Model):
    """One registered PostgreSQL database."""

    dsn: SecretStr
    tables: tuple[str, ...] | None = None
    schemas: tuple[str, ...] | None = None
    snapshot: Literal["initial", "never", "when_needed", "initial_only"] = "initial"
    heartbeat_interval_s: float = Field(default=10.0, gt=0)
    slot: str | None = None
    publication: str | None = None
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


class ExpectationConfig(BaseModel):
    """A Great Expectations 1.x expectation: its name under ``expect``, its arguments beside it."""

    model_config = ConfigDict(frozen=True, extra="allow")

    expect: Annotated[str, Field(pattern=r"^expect_[a-z0-9_]+$")]
    action: Literal["warn", "drop", "fail"] | None = None
    blocking: bool = False

    @property
    def kwargs(self) -> dict[str, Any]:
        """The expectation's own arguments (everything but ``expect``, ``action``, ``blocking``)."""
        return dict(self.model_extra or {})


class FeedConfig(_Model):
    """A derived feed: SQL over the current row image of ``from``, keyed by ``key``."""

    from_: str = Field(alias="from")
    sql: str
    key: tuple[str, ...]
    expectations: tuple[ExpectationConfig, ...] = ()
    #: Tables joined in the SQL: view name -> topic or feed, read as its latest value per key.
    lookups: dict[str, str] = {}


def _exclusive(value: Any, info: ValidationInfo, *others: str) -> None:
    """Raise when ``info.field_name`` is given together with an earlier field among ``others``."""
    given = [name for name in others if info.data.get(name) not in (None, False)]
    if value not in (None, False) and given:
        msg = f"cannot be given with {given[0]}; keep one"
        raise ValueError(msg)


def _names(value: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if value is not None and (not value or len(set(value)) != len(value)):
        msg = "give one or more distinct column names"
        raise ValueError(msg)
    return value


class FreshnessConfig(_Model):
    """How fresh a warehouse table must be: loaded at most ``fail_after_s`` ago (a warning after ``warn_after_s``)."""

    fail_after_s: float = Field(default=3600.0, gt=0)
    warn_after_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _warn_before_fail(self) -> FreshnessConfig:
        if self.warn_after_s is not None and self.warn_after_s >= self.fail_after_s:
            msg = "warn_after_s must be less than fail_after_s"
            raise ValueError(msg)
        return self


class TableConfig(_Model):
    """A warehouse table materialised from a topic or feed, with Databricks AUTO CDC's options.

    ``track_history_columns`` is AUTO CDC's ``track_history_column_list``. Options that
    exclude each other, and SCD2-only options on an SCD1 table, are refused here; column
    names are checked against the change batch when the table is loaded
    (:mod:`warehouse_loader.cdc_options`, which also states each option's semantics).
    """

    from_: str = Field(alias="from")
    mode: Literal["scd1", "scd2"] = "scd1"
    sequence_by: str | None = None
    column_list: tuple[str, ...] | None = None
    except_column_list: tuple[str, ...] | None = None
    ignore_null_updates: bool = False
    ignore_null_updates_column_list: tuple[str, ...] | None = None
    ignore_null_updates_except_column_list: tuple[str, ...] | None = None
    #: A SQL boolean expression over the row image: rows where it holds are deletes (soft deletes).
    apply_as_deletes: str | None = None
    apply_as_truncates: bool = Field(default=True, validate_default=True)
    track_history_columns: tuple[str, ...] | None = None
    track_history_except_column_list: tuple[str, ...] | None = None
    #: Overrides ``warehouse.freshness`` for this table (Dagster's freshness policy).
    freshness: FreshnessConfig | None = None

    @field_validator(
        "column_list",
        "except_column_list",
        "ignore_null_updates_column_list",
        "ignore_null_updates_except_column_list",
        "track_history_columns",
        "track_history_except_column_list",
    )
    @classmethod
    def _column_names(cls, value: tuple[str, ...] | None, info: ValidationInfo) -> tuple[str, ...] | None:
        value = _names(value)
        earlier = {
            "except_column_list": ("column_list",),
            "ignore_null_updates_column_list": ("ignore_null_updates",),
            "ignore_null_updates_except_column_list": ("ignore_null_updates", "ignore_null_updates_column_list"),
            "track_history_except_column_list": ("track_history_columns",),
        }
        _exclusive(value, info, *earlier.get(info.field_name or "", ()))
        history = info.field_name in ("track_history_columns", "track_history_except_column_list")
        if value is not None and history and info.data.get("mode") != "scd2":
            msg = "tracks history, so it needs mode: scd2; remove it or set mode: scd2"
            raise ValueError(msg)
        excluded = set(info.data.get("except_column_list") or ())
        kept = info.data.get("column_list")
        dropped = [c for c in value or () if c in excluded or (kept is not None and c not in kept)]
        if dropped and info.field_name not in ("column_list", "except_column_list"):
            msg = f"names {', '.join(dropped)}, left out of the table by column_list/except_column_list"
            raise ValueError(msg)
        return value

    @field_validator("apply_as_deletes")
    @classmethod
    def _delete_condition(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            msg = 'give a SQL boolean expression over the row\'s columns, e.g. "is_deleted"'
            raise ValueError(msg)
        return value

    @field_validator("apply_as_truncates")
    @classmethod
    def _truncate_needs_sequence(cls, value: bool, info: ValidationInfo) -> bool:
        column = info.data.get("sequence_by")
        if value and column:
            msg = (
                f"a truncate carries no row, so it has no value of sequence_by column {column!r}; "
                "set apply_as_truncates: false (truncates are then ignored) or remove sequence_by"
            )
            raise ValueError(msg)
        return value


#: Object stores delta-rs writes to (``file://`` is a local path spelled as a URL).
WAREHOUSE_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "file")


class WarehouseConfig(_Model):
    """Where the warehouse lives (a local path or an object store URL) and its tables, by name."""

    #: Default ``<home>/warehouse``; a local path (relative to this file) or ``s3://bucket/prefix``,
    #: ``gs://...``, ``az://...``.
    path: str | None = None
    #: Handed to delta-rs and pyarrow's filesystem as they are (``AWS_REGION``, ``AWS_ENDPOINT_URL``,
    #: credentials via ``${VAR}``); never shown.
    storage_options: SettingsMap = {}
    tables: dict[str, TableConfig] = {}
    freshness: FreshnessConfig = FreshnessConfig()

    @field_validator("path")
    @classmethod
    def _known_store(cls, value: str | None) -> str | None:
        if value is None or "://" not in value:
            return value
        scheme = value.split("://", 1)[0].lower()
        if scheme not in WAREHOUSE_SCHEMES or not value.split("://", 1)[1].strip("/"):
            msg = f"must be a local path or s3://bucket/prefix (gs://, az://), got {value!r}"
            raise ValueError(msg)
        return value.rstrip("/")


class ProjectConfig(_Model):
    """The whole ``headwater.yaml``."""

    project: Annotated[str, Field(pattern=_NAME)]
    home: Path = Path(".headwater")
    log: LogConfig = LogConfig()
    sources: dict[str, SourceConfig] = {}
    feeds: dict[str, FeedConfig] = {}
    warehouse: WarehouseConfig = WarehouseConfig()
    quality: dict[str, tuple[ExpectationConfig, ...]] = {}
    spark: SparkConfig = SparkConfig()

    #: The file this config was loaded from (set by :func:`load_config`).
    config_path: Path | None = Field(default=None, exclude=True)

    @field_validator("sources", "feeds")
    @classmethod
    def _names_are_identifiers(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not re.match(_NAME, name):
                msg = f"name {name!r} must be letters, digits and '_' and not start with a digit"
                raise ValueError(msg)
        return value

    @property
    def home_dir(self) -> Path:
        """The state directory, resolved against the config file's folder."""
        return self._beside_config(self.home)

    def _beside_config(self, path: Path) -> Path:
        if path.is_absolute() or self.config_path is None:
            return path
        return self.config_path.parent / path

    @property
    def checkpoint_dir(self) -> Path:
        """Spark jobs' streaming checkpoints: ``spark.checkpoint_path``, default ``<home>/checkpoints``."""
        configured = self.spark.checkpoint_path
        return self.home_dir / "checkpoints" if configured is None else self._beside_config(configured)

    @property
    def warehouse_root(self) -> str:
        """The warehouse's location: an absolute local path, or an object store URL (no trailing ``/``)."""
        path = self.warehouse.path
        if path is None:
            return str(self.home_dir / "warehouse")
        if path.lower().startswith("file://"):
            path = path[len("file://") :]
        elif "://" in path:
            return path
        return str(self._beside_config(Path(path)))


def find_config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Locate the config: ``--config``, else ``$HEADWATER_CONFIG``, else ``./headwater.yaml``."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(CONFIG_ENV_VAR)
    if env:
        return Path(env)
    return Path.cwd() / DEFAULT_CONFIG_NAME


def unset_variables(text: str) -> list[str]:
    """The ``${VAR}`` references still in ``text``: variables that were unset when the config was loaded.

    A config loaded with ``strict_env=False`` keeps them as written; a DSN holding one
    cannot log in, so a command reports the source instead of connecting.
    """
    return _ENV_REF.findall(text)


def _interpolate(node: Any, path: str, source: Path, env: Mapping[str, str], strict: bool = True) -> Any:
    if isinstance(node, str):

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                if not strict:
                    return match.group(0)  # left as written; only commands that use it need it
                msg = f"{source}: {path}: environment variable {name} is not set; export it or edit the file"
                raise ConfigError(msg, path=str(source), field=path)
            return env[name]

        return _ENV_REF.sub(replace, node)
    if isinstance(node, dict):
        return {k: _interpolate(v, f"{path}.{k}" if path else str(k), source, env, strict) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, f"{path}[{i}]", source, env, strict) for i, v in enumerate(node)]
    return node


def _describe(error: dict[str, Any]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    got = error.get("input")
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}, got {got!r}"
    if kind == "extra_forbidden":
        return "unknown key; remove it or check its spelling"
    if kind == "missing":
        return "is required"
    if kind == "string_pattern_mismatch":
        return f"{got!r} does not match {ctx.get('pattern')}"
    message = str(error.get("msg", "invalid value"))
    return message.removeprefix("Value error, ")


def _field_path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts).replace("from_", "from")


def parse_config(
    raw: Any, source: Path, env: Mapping[str, str] | None = None, *, strict_env: bool = True
) -> ProjectConfig:
    """Validate an already-parsed YAML document; errors name ``source`` and the field path.

    With ``strict_env=False`` an unset ``${VAR}`` stays as written instead of failing, for
    commands that never connect to a source (``log``, ``query``).
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        msg = f"{source}: the file must hold a mapping of keys (project, log, sources, ...)"
        raise ConfigError(msg, path=str(source))
    data = _interpolate(raw, "", source, os.environ if env is None else env, strict_env)
    try:
        config = ProjectConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = _field_path(tuple(first["loc"])) or "(top level)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        msg = f"{source}: {field}: {_describe(dict(first))}{more}"
        raise ConfigError(msg, path=str(source), field=field) from None
    _check_feed_graph(config, source)
    return config.model_copy(update={"config_path": source.resolve()})


def _check_feed_graph(config: ProjectConfig, source: Path) -> None:
    """Feeds read feeds (``from``, ``lookups``) as a DAG: a cycle is an error naming it."""
    graph = {
        name: [up for up in (feed.from_, *feed.lookups.values()) if up in config.feeds]
        for name, feed in config.feeds.items()
    }
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        cycle: list[str] = exc.args[1]
        name, upstream = cycle[-1], cycle[-2]
        field = "from" if config.feeds[name].from_ == upstream else "lookups"
        msg = (
            f"{source}: feeds.{name}.{field}: feeds form a cycle ({' <- '.join(reversed(cycle))}); "
            "a feed may only read raw topics or feeds upstream of it"
        )
        raise ConfigError(msg, path=str(source), field=f"feeds.{name}.{field}") from None


def load_config(explicit: str | os.PathLike[str] | None = None, *, strict_env: bool = True) -> ProjectConfig:
    """Find, read, interpolate and validate ``headwater.yaml`` (see :func:`parse_config`)."""
    path = find_config_path(explicit)
    if not path.is_file():
        msg = f"{path}: no such config file; run 'headwater init' or pass --config"
        raise ConfigError(msg, path=str(path))
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        msg = f"{path}: invalid YAML{where}: {problem}; fix the file and retry"
        raise ConfigError(msg, path=str(path)) from None
    config = parse_config(raw, path, strict_env=strict_env)
    _loaded_config_file[:] = [path]
    return config


#: The config file this process loaded last (errors found later name it, as load errors do).
_loaded_config_file: list[Path] = []


def loaded_config_name() -> str:
    """The path of the config file this process loaded, for error messages; ``headwater.yaml`` if none."""
    return str(_loaded_config_file[0]) if _loaded_config_file else DEFAULT_CONFIG_NAME
