"""``headwater_log``: a Spark Python data source (batch and streaming) over the :class:`~log.base.Log`.

Register it once per session with :func:`register_log_source`, then::

    spark.read.format("headwater_log").option("config", "headwater.yaml")
        .option("topic", "shop.public.customers").load()
    spark.readStream.format("headwater_log").option("config", ...).option("topic", ...)
        .option("maxRecordsPerBatch", 10000).load()

Options (all strings, as Spark passes them):

* ``config``: path of ``headwater.yaml``. Executors are separate Python processes: each
  opens the log itself (``open_log(load_config(path))``) inside ``read()``, so only
  this path travels, never a connection.
* ``topic``: one topic, or several separated by commas (their ``before``/``after``
  structs are merged by column name).
* ``startingOffsets``: ``earliest`` (default) | ``latest`` | JSON per partition
  (``{"0": 12}`` for one topic, ``{"<topic>": {"0": 12}}``; -2 earliest, -1 latest).
  A streaming query uses it only when it has no checkpoint.
* ``endingOffsets`` (batch only): ``latest`` (default) or JSON as above.
* ``maxRecordsPerBatch`` (streaming): at most this many offsets per micro-batch
  (shared across partitions by backlog); ``availableNow`` honours it.
* ``maxBytesPerBatch`` (streaming): at most about this many bytes of records (keys and values
  as the log holds them before compression) per micro-batch, estimated from a sample of each
  partition's records where the batch starts; at least one record. :func:`log_reader` sets
  it from ``spark.driver_memory`` (:func:`default_batch_bytes`): a backlog of wide rows is
  read in micro-batches the driver can hold, whatever their count of records.
* ``maxRecordsPerPartition``: a partition range longer than this is split into several
  Spark input partitions (default 100000).
* ``includeTombstones``: ``true`` keeps the null-value records that follow deletes
  (``op`` and images null); default ``false``.
* ``unconstrainedNumeric``: ``string`` (default, exact) | ``decimal`` (Decimal(38,10)).
* ``currentColumns``: ``true``: images with the latest version's columns only (no dropped ones;
  feeds read so: SQL naming a dropped or renamed column fails when planned).
* ``latestPerKey``: ``true`` gives, per ``(topic, key)``, only the latest row change of the
  read (micro-batch), plus column ``__hw_first_op`` (the key's first op in it); rows
  without a key stay, messages go. Ranges are then never split: the rule is applied per
  log partition in the reader, which is exact because a key's records all live in one
  partition (:mod:`spark_log.latest_per_key`). Feeds read this way, without a shuffle.

The output schema is :func:`spark_log.source_schema.output_schema`; ``before``/``after``
are typed STRUCTs from the topics' latest schema in ``_headwater.schemas`` (JSON strings
when a topic has none). The schema is fixed when the query is planned: a streaming query
picks up a new column at its next start (from its checkpoint).

Reading: a file log's ranges are read as Arrow columns straight from the segments' bytes
(:mod:`log.file.column_decoder`, no object per record) and built by
:meth:`~spark_log.source_batches.SourceBatchBuilder.build_columns`; other backends hand
``StoredRecord`` chunks to :meth:`~spark_log.source_batches.SourceBatchBuilder.build`. Both
give the same rows. The readers carry a :class:`BatchShape` and make the builder where they
first read, so the processes that only plan (a source runner per streaming query, the planner
workers) never import the batch building.

Errors: a Headwater error raised in any method Spark calls in a Python worker (the planner
process, executors) leaves it as :class:`spark_log.task_errors.CarriedError`, so the driver
rebuilds it (:func:`spark_log.task_errors.unwrap`) and the CLI prints its own line.

Offsets: one position per partition, ``{"<topic>": {"<partition>": next offset}}``; a
micro-batch ends at the partitions' ``end_offset`` seen when Spark asks for the latest
offset, so records appended later go to a later batch, never twice.

Split topics (:mod:`log.shards`): a micro-batch reads a child partition only when it
starts with every parent of the child read to the parent's sealed end (the child stays
where it is until then), so each key's records reach the query batch after batch in the
order they were written. A batch read (``spark.read``) reads every partition at once,
parents and children alike: its rows have no order, as with any DataFrame; order them
by ``sequence`` (capture topics) or by the parent-first partition numbers.

(Over 500 lines: the Spark source's offsets, partition planning across splits and
merges, and its schema checks share the offset format and must be read together.)
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StringType, StructType

from core.config import ProjectConfig, load_config
from core.source_config import TypesConfig
from log.base import Log
from log.columns import ColumnarReads
from log.errors import UnknownTopicError
from log.factory import open_log
from log.reading import READ_CHUNK, read_range, read_range_columns
from log.shards import shard_map_of
from log.table_schemas import read_schema_records
from spark_log.errors import LogSourceOptionError
from spark_log.offsets import LogPosition, OffsetRange, OffsetsSpec, admit, admit_bytes, offset_ranges
from spark_log.schema_guard import check_schema_versions
from spark_log.source_schema import (
    FIRST_OP,
    RowSchema,
    UnconstrainedNumeric,
    merged_struct,
    output_schema,
    row_schema,
)
from spark_log.task_errors import carried_errors, carried_iteration

if TYPE_CHECKING:
    from pyspark.sql import DataFrameReader, SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamReader

    from spark_log.source_batches import SourceBatchBuilder

SOURCE_NAME = "headwater_log"
DEFAULT_SPLIT_RECORDS = 100_000
#: The same for a columnar read, whose bulk decode has per-call costs worth spreading (~10 % less CPU than
#: 10k here), and its byte bound: a few tens of MB of values per batch.
COLUMN_READ_CHUNK = 50_000
COLUMN_READ_BYTES = 32 * 1024 * 1024
_UNSPLIT = 1 << 62
#: Records read where a micro-batch starts to estimate its partition's bytes per record (``maxBytesPerBatch``).
SIZE_SAMPLE = 256
#: The share of ``spark.driver_memory`` one micro-batch's records may take by default (:func:`default_batch_bytes`).
BATCH_MEMORY_SHARE = 4


@dataclass(frozen=True, slots=True)
class LogSourceOptions:
    """The validated options (picklable: plain values only)."""

    config_path: str
    topics: tuple[str, ...]
    starting: str | None
    ending: str | None
    max_records_per_batch: int | None
    split_records: int
    include_tombstones: bool
    unconstrained_numeric: UnconstrainedNumeric
    latest_per_key: bool = False
    current_columns: bool = False
    max_bytes_per_batch: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> LogSourceOptions:
        """Validate Spark's (case-insensitive) option map."""
        lowered = {key.lower(): value for key, value in options.items()}
        config_path = lowered.get("config") or lowered.get("path")
        if not config_path:
            msg = "give the path of headwater.yaml: .option('config', path)"
            raise LogSourceOptionError(msg, option="config")
        topics = tuple(t.strip() for t in lowered.get("topic", "").split(",") if t.strip())
        if not topics:
            msg = "name the topic to read: .option('topic', 'shop.public.customers')"
            raise LogSourceOptionError(msg, option="topic")
        numeric = lowered.get("unconstrainednumeric", "string").lower()
        if numeric not in ("string", "decimal"):
            msg = f"expected 'string' or 'decimal', got {numeric!r}"
            raise LogSourceOptionError(msg, option="unconstrainedNumeric")
        return cls(
            config_path=config_path,
            topics=topics,
            starting=lowered.get("startingoffsets"),
            ending=lowered.get("endingoffsets"),
            max_records_per_batch=_positive(lowered, "maxRecordsPerBatch"),
            split_records=_positive(lowered, "maxRecordsPerPartition") or DEFAULT_SPLIT_RECORDS,
            include_tombstones=_flag(lowered, "includeTombstones"),
            unconstrained_numeric=cast(Literal["string", "decimal"], numeric),
            latest_per_key=_flag(lowered, "latestPerKey"),
            current_columns=_flag(lowered, "currentColumns"),
            max_bytes_per_batch=_positive(lowered, "maxBytesPerBatch"),
        )

    @property
    def range_split(self) -> int:
        """Offsets per Spark input partition (a whole partition range when rows are reduced per key)."""
        return _UNSPLIT if self.latest_per_key else self.split_records

    def load_config(self) -> ProjectConfig:
        """The project config the path names; an unset ``${VAR}`` stays as written.

        Reading the log never needs a source's DSN password, so Spark's Python workers
        do not require it in their environment. A Python worker is reused for task after task
        (``spark.python.worker.reuse``), each reading a range of the same config's log: the config
        is read again only when its file changed (path, size and modification time).
        """
        try:
            stat = os.stat(self.config_path)
        except OSError:
            return load_config(self.config_path, strict_env=False)  # its own error for a missing file
        key = (self.config_path, stat.st_size, stat.st_mtime_ns)
        config = _CONFIGS.get(key)
        if config is None:
            config = load_config(self.config_path, strict_env=False)
            _CONFIGS.clear()  # one config per process in practice: never a growing cache
            _CONFIGS[key] = config
        return config


#: The config :meth:`LogSourceOptions.load_config` read last in this process, by path, size and mtime.
_CONFIGS: dict[tuple[str, int, int], ProjectConfig] = {}


def _positive(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name.lower())
    if text is None or not text.strip():
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"expected a positive integer, got {text!r}"
        raise LogSourceOptionError(msg, option=name)
    return value


def _flag(options: Mapping[str, str], name: str) -> bool:
    text = options.get(name.lower(), "false").strip().lower()
    if text not in ("true", "false"):
        msg = f"expected true or false, got {text!r}"
        raise LogSourceOptionError(msg, option=name)
    return text == "true"


def register_log_source(spark: SparkSession) -> None:
    """Make ``spark.read/readStream.format("headwater_log")`` available in this session (once per session).

    Registering again replaced the source with an equal one (a pickled copy and a warning each
    time), and failed with ``DATA_SOURCE_ALREADY_EXISTS`` while a query of another session of the
    same JVM ran (feeds run side by side, one thread and session each): so once, under a lock.

    Spark refuses a name that the thread's *active* session already knows, whichever session is
    being registered in: a session from ``newSession()`` failed so while its parent, still the
    active one, had the source. ``spark`` is made the active session for the registration.
    """
    session = str(spark._jsparkSession.sessionUUID())
    with _REGISTERING:
        if session not in _REGISTERED:
            with _active_session(spark):
                spark.dataSource.register(HeadwaterLogDataSource)
            _REGISTERED.add(session)


@contextmanager
def _active_session(spark: SparkSession) -> Iterator[None]:
    """``spark`` as this thread's active session in the JVM; the one before it afterwards."""
    sessions = getattr(spark._jvm, "org.apache.spark.sql.classic.SparkSession")  # as pyspark names it
    before = sessions.getActiveSession()
    sessions.setActiveSession(spark._jsparkSession)
    try:
        yield
    finally:
        if before.isDefined():
            sessions.setActiveSession(before.get())
        else:
            sessions.clearActiveSession()


_REGISTERING = threading.Lock()
#: The sessions (by UUID, never reused) this process registered the source in.
_REGISTERED: set[str] = set()


def log_reader(
    spark: SparkSession, config: ProjectConfig, topic: str, *, streaming: bool = False
) -> DataFrameReader | DataStreamReader:
    """``spark.read`` (``readStream`` when ``streaming``) of the project log's ``topic`` (or several, comma-separated).

    Registers the source in the session; further options (offsets, batch size) may follow.
    """
    register_log_source(spark)
    reader = spark.readStream if streaming else spark.read
    reader = reader.format(SOURCE_NAME).option("config", str(config.config_path)).option("topic", topic)
    return reader.option("maxBytesPerBatch", str(default_batch_bytes(config))) if streaming else reader


def default_batch_bytes(config: ProjectConfig) -> int:
    """A streaming read's default ``maxBytesPerBatch``: a quarter of ``spark.driver_memory``.

    A micro-batch's rows come back to the driver (a feed's output as Arrow, a load's changes),
    and in ``local`` mode the executors share the driver's heap: 1.2M records of 521 bytes (625
    MB) ran a 1 GB driver out of heap (``bench/backlog_memory_bench.py``, issue 31).
    """
    return config.spark.driver_memory_bytes // BATCH_MEMORY_SHARE


# --------------------------------------------------------------------------- planning (driver)


def topic_modes(config: ProjectConfig, topic: str) -> TypesConfig:
    """The type modes the topic's values were written with (its source's ``types``)."""
    source = config.sources.get(topic.split(".", 1)[0])
    return source.types if source is not None else TypesConfig()


def plan_row_schemas(
    log: Log, config: ProjectConfig, topics: Sequence[str], *, current_only: bool = False
) -> dict[str, RowSchema] | None:
    """Row schemas of all ``topics``, or ``None`` when any lacks a schema record (JSON images)."""
    records = read_schema_records(log, topics)
    if any(topic not in records for topic in topics):
        return None
    return {
        topic: row_schema(topic, records[topic], topic_modes(config, topic), current_only=current_only)
        for topic in topics
    }


def current_ends(log: Log, topics: Sequence[str]) -> LogPosition:
    """``end_offset`` of every partition of ``topics`` now."""
    ends: dict[tuple[str, int], int] = {}
    for topic in topics:
        for partition in range(log.describe_topic(topic).partitions):
            ends[(topic, partition)] = log.end_offset(topic, partition)
    return LogPosition.of(ends)


def hold_children(log: Log, topics: Sequence[str], begin: LogPosition, end: LogPosition) -> LogPosition:
    """``end`` with each child of a split topic kept at its start while a parent is not read to its sealed end."""
    offsets = end.as_dict()
    for topic in topics:
        shards = shard_map_of(log, topic)
        if shards is None:
            continue
        for shard in shards.shards:
            where = (topic, shard.number)
            if where not in offsets:
                continue
            for number in shard.parents:
                sealed = shards.shard(number).sealed_end
                assert sealed is not None
                started = begin.get(topic, number) or 0
                if started < sealed and log.beginning_offset(topic, number) < sealed:
                    offsets[where] = begin.get(topic, shard.number) or 0
                    break
    return LogPosition.of(offsets)


def resolve_position(log: Log, topics: Sequence[str], spec: OffsetsSpec) -> LogPosition:
    """What ``spec`` means for every partition now."""
    resolved: dict[tuple[str, int], int] = {}
    for topic in topics:
        for partition in range(log.describe_topic(topic).partitions):
            resolved[(topic, partition)] = spec.resolve(
                topic,
                partition,
                beginning=log.beginning_offset(topic, partition),
                end=log.end_offset(topic, partition),
            )
    return LogPosition.of(resolved)


# --------------------------------------------------------------------------- Spark classes


class LogRangePartition(InputPartition):
    """One Spark input partition: one offset range of one log partition."""

    def __init__(self, offsets: OffsetRange) -> None:
        super().__init__(offsets)
        self.offsets = offsets


@dataclass(frozen=True)
class BatchShape:
    """What a reader's record batches are built to: the declared schema and each topic's row schema.

    The readers carry this and make their :class:`~spark_log.source_batches.SourceBatchBuilder`
    where they first read: the Python processes that only plan (the query's source runner, the
    planner workers) then never import the batch building (pyarrow.compute and the value
    decoders, ~30 ms CPU of each such process; Spark starts one runner per streaming query).
    """

    schema: StructType
    row_schemas: Mapping[str, RowSchema] | None
    include_tombstones: bool
    unconstrained: UnconstrainedNumeric

    def builder(self) -> SourceBatchBuilder:
        """A builder for this shape (imports the batch building: call it where batches are read)."""
        from spark_log.source_batches import SourceBatchBuilder

        return SourceBatchBuilder(
            self.schema, self.row_schemas, include_tombstones=self.include_tombstones, unconstrained=self.unconstrained
        )


class _RangeReading:
    """Executor side shared by both readers: open the log in the worker, decode each chunk."""

    options: LogSourceOptions
    shape: BatchShape
    _built: SourceBatchBuilder | None = None

    @property
    def builder(self) -> SourceBatchBuilder:
        """The batch builder of :attr:`shape`, made on first use (in the process that reads)."""
        if self._built is None:
            self._built = self.shape.builder()
        return self._built

    def _read_ranges(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, LogRangePartition):
            return  # Spark's placeholder partition when there is nothing to read
        offsets = partition.offsets
        log = open_log(self.options.load_config())
        try:
            topic, number, start, end = offsets.topic, offsets.partition, offsets.start, offsets.end
            batches: Iterator[pa.RecordBatch]
            if isinstance(log, ColumnarReads):  # columns straight from the segments' bytes
                columns = read_range_columns(
                    log, topic, number, start, end, max_records=COLUMN_READ_CHUNK, max_bytes=COLUMN_READ_BYTES
                )
                batches = map(self.builder.build_columns, columns)
            else:
                batches = map(self.builder.build, read_range(log, topic, number, start, end))
            if self.options.latest_per_key:
                batches = self._latest_per_key(list(batches))
            for batch in batches:
                if batch.num_rows:
                    yield batch
        finally:
            log.close()
        _freeze_after_the_first_read()

    def _latest_per_key(self, batches: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from spark_log.latest_per_key import latest_per_key  # the read side's only (BatchShape)
        from spark_log.source_batches import arrow_schema

        if not batches:
            return
        # StructType.add changes the struct in place: add to a copy, the builder's schema stays as declared.
        target = arrow_schema(StructType(list(self.builder.schema.fields)).add(FIRST_OP, StringType()))
        latest = latest_per_key(pa.Table.from_batches(batches))
        for batch in latest.to_batches(max_chunksize=READ_CHUNK * 5):
            yield pa.RecordBatch.from_arrays(batch.columns, schema=target)


class HeadwaterLogDataSource(DataSource):
    """The ``headwater_log`` data source (see the module docstring for options and schema)."""

    @carried_errors
    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)  # type: ignore[arg-type]  # Spark passes a CaseInsensitiveDict
        self.parsed = LogSourceOptions.parse(options)
        # Planned once, in the planner process, and pickled with the source to the readers.
        self._row_schemas: dict[str, RowSchema] | None = None
        self._schema: StructType | None = None

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return SOURCE_NAME

    @carried_errors
    def schema(self) -> StructType:
        """Read ``_headwater.schemas`` and build the output schema."""
        if self._schema is None:
            config = self.parsed.load_config()
            log = open_log(config)
            try:
                missing = [t for t in self.parsed.topics if t not in log.list_topics()]
                if missing:
                    raise UnknownTopicError(missing[0])
                self._row_schemas = plan_row_schemas(
                    log, config, self.parsed.topics, current_only=self.parsed.current_columns
                )
            finally:
                log.close()
            row = None
            if self._row_schemas is not None:
                row = merged_struct(list(self._row_schemas.values()), self.parsed.unconstrained_numeric)
            self._schema = output_schema(row)
            if self.parsed.latest_per_key:
                self._schema = output_schema(row).add(FIRST_OP, StringType())
        return self._schema

    def _shape(self, schema: StructType) -> BatchShape:
        self.schema()
        if self.parsed.latest_per_key:  # the builder makes the rows, the reader adds the first op
            schema = StructType([field for field in schema.fields if field.name != FIRST_OP])
        return BatchShape(schema, self._row_schemas, self.parsed.include_tombstones, self.parsed.unconstrained_numeric)

    @carried_errors
    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader."""
        return LogBatchReader(self.parsed, self._shape(schema))

    @carried_errors
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The micro-batch reader."""
        return LogStreamReader(self.parsed, self._shape(schema))


class LogBatchReader(_RangeReading, DataSourceReader):
    """Reads ``startingOffsets`` to ``endingOffsets`` (ends taken when Spark plans the query)."""

    def __init__(self, options: LogSourceOptions, shape: BatchShape) -> None:
        self.options = options
        self.shape = shape

    @carried_errors
    def partitions(self) -> Sequence[InputPartition]:
        """One input partition per log partition range (split when long)."""
        log = open_log(self.options.load_config())
        try:
            topics = self.options.topics
            starting = OffsetsSpec.parse("startingOffsets", self.options.starting, topics, "earliest")
            ending = OffsetsSpec.parse("endingOffsets", self.options.ending, topics, "latest")
            start = resolve_position(log, topics, starting)
            end = resolve_position(log, topics, ending)
            split = [t for t in topics if shard_map_of(log, t) is not None]
            if self.options.latest_per_key and split:
                # The reader's per-partition rule needs each key in one partition of the read.
                msg = (
                    f"a batch read of {split[0]}, a topic whose partitions were split or merged "
                    "(a key's records span partitions there); read it as a stream, or without latestPerKey"
                )
                raise LogSourceOptionError(msg, option="latestPerKey")
        finally:
            log.close()
        return [LogRangePartition(r) for r in offset_ranges(start, end, split_records=self.options.range_split)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Record batches of one range (runs in an executor's Python worker)."""
        return carried_iteration(self._read_ranges(partition))


class LogStreamReader(_RangeReading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over the log: offsets per partition, admission control, ``availableNow``.

    The driver-side methods run in one long-lived Python process per query, which keeps
    the log open between calls; ``read`` runs in executors, which open their own.
    """

    def __init__(self, options: LogSourceOptions, shape: BatchShape) -> None:
        self.options = options
        self.shape = shape
        self._log: Log | None = None  # opened on first use: this object is pickled to executors first
        self._target: LogPosition | None = None
        self._schemas_seen_at: LogPosition | None = None
        self._sizes: dict[tuple[str, int], tuple[int, float]] = {}  # (topic, partition) -> (offset, mean bytes)

    def _driver_log(self) -> Log:
        if self._log is None:
            self._log = open_log(self.options.load_config())
        return self._log

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_log"] = None
        return state

    @carried_errors
    def initialOffset(self) -> dict[str, Any]:
        """Where a query without checkpoint starts (``startingOffsets``)."""
        topics = self.options.topics
        spec = OffsetsSpec.parse("startingOffsets", self.options.starting, topics, "earliest")
        return resolve_position(self._driver_log(), topics, spec).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRecordsPerBatch`` as Spark's row limit, else everything available."""
        limit = self.options.max_records_per_batch
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    @carried_errors
    def prepareForTriggerAvailableNow(self) -> None:
        """Freeze the target: an ``availableNow`` run reads up to today's ends and stops."""
        self._target = current_ends(self._driver_log(), self.options.topics)

    @carried_errors
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the next micro-batch: the partitions' ends, capped by the target and the limit.

        Raises :class:`SchemaChangedError` when a topic has a schema version the query was not
        planned with: capture appends a version before any record written with it, so every
        record below the ends taken here has a version the check below sees.
        """
        available = self._target or current_ends(self._driver_log(), self.options.topics)
        self._check_schemas()
        begin = LogPosition.from_json(start)
        # Never move backwards (a partition of the target the start already passed).
        floor = begin.as_dict()
        available = LogPosition.of({k: max(v, floor.get(k, 0)) for k, v in available.as_dict().items()})
        # A split topic's children wait for a batch that starts with their parents read to the end.
        available = hold_children(self._driver_log(), self.options.topics, begin, available)
        end = admit(begin, available, limit.max_rows) if isinstance(limit, ReadMaxRows) else available
        if self.options.max_bytes_per_batch is not None:
            end = admit_bytes(begin, end, self.options.max_bytes_per_batch, self._record_bytes)
        return end.to_json()

    def _record_bytes(self, topic: str, partition: int, offset: int) -> float:
        """Mean bytes (key + value) of up to :data:`SIZE_SAMPLE` records from ``offset`` (kept per offset)."""
        kept = self._sizes.get((topic, partition))
        if kept is not None and kept[0] == offset:
            return kept[1]
        sample = self._driver_log().read(topic, partition, offset, max_records=SIZE_SAMPLE, max_bytes=1 << 20)
        mean = sum(len(r.key or b"") + len(r.value or b"") for r in sample) / len(sample) if sample else 0.0
        self._sizes[(topic, partition)] = (offset, mean)
        return mean

    def _check_schemas(self) -> None:
        """Raise :class:`SchemaChangedError` when a topic has a schema version the query was not planned with."""
        self._schemas_seen_at = check_schema_versions(
            self._driver_log(), self.options.topics, self.shape.row_schemas, self._schemas_seen_at
        )

    @carried_errors
    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The log's current ends, for the query progress."""
        return current_ends(self._driver_log(), self.options.topics).to_json()

    @carried_errors
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One input partition per partition range of the micro-batch."""
        ranges = offset_ranges(
            LogPosition.from_json(start), LogPosition.from_json(end), split_records=self.options.range_split
        )
        return [LogRangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Record batches of one range (runs in an executor's Python worker)."""
        return carried_iteration(self._read_ranges(partition))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: Spark's checkpoint holds the position, the log keeps the records."""

    def stop(self) -> None:
        """Close the driver-side log."""
        if self._log is not None:
            self._log.close()
            self._log = None


def _in_a_daemon_worker() -> bool:
    """True in a Python worker that pyspark's daemon forked (its ``__main__`` is ``pyspark.daemon``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == "pyspark.daemon"


# pyspark's daemon runs a full ``gc.collect()`` after every task of a reused Python worker
# (``pyspark/daemon.py``). Over all that a read worker has imported (pyspark, pyarrow, the config
# models, the log) that collection was ~90 % of the worker's samples in a following load (py-spy),
# ~25 ms per micro-batch. What exists once this module is imported lives as long as the worker:
# frozen, it is left out of every later collection, which then only sees what a task allocated.
# Only there: a worker ends with ``os._exit``, while a process that exits normally collects its
# objects at exit, and frozen ones stay uncollected (DuckDB's nanobind bindings then print
# "leaked instances" on stderr, seen in a CLI's one-line error).
if _in_a_daemon_worker():
    gc.freeze()


@functools.cache
def _freeze_after_the_first_read() -> None:
    """In a daemon's worker, freeze once more after its first read: what pyspark imported for the task.

    pyspark's worker imports pandas (~30,000 tracked objects) after it unpickled the reader, so after
    the freeze above, and every later task's collection still visited them: the read workers of a
    following load spent 1.14 CPU s over 123 micro-batches with the one freeze, 0.42 with both.
    Garbage in a cycle that the first task leaves is frozen with them, once per worker (cached:
    later reads return at once).
    """
    if _in_a_daemon_worker():
        gc.freeze()
