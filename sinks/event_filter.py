"""A sink's ``filter:``: a SQL predicate on each event, evaluated by DuckDB over a batch at a time.

The predicate sees one relation, ``event``, with a row per record::

    topic VARCHAR, partition INTEGER, offset BIGINT, timestamp_ms BIGINT,
    key JSON, op VARCHAR, before JSON, after JSON, source JSON, ts_ms BIGINT

Row images are JSON, read with DuckDB's operators and an explicit type, so a value is never
compared by a guessed type: ``op <> 'd' AND (after->>'region')::INT = 3``. An event for
which the predicate is true is delivered; false or null: skipped (its offset still counts
as processed). A predicate DuckDB cannot bind is refused when the sink starts, in one line.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

from log.base import StoredRecord
from sinks.errors import SinkConfigError

_EVENT = """
SELECT idx FROM (
    SELECT idx, topic, "partition", "offset", timestamp_ms, key::JSON AS key,
           value::JSON->>'op' AS op, value::JSON->'before' AS before, value::JSON->'after' AS after,
           value::JSON->'source' AS source, (value::JSON->>'ts_ms')::BIGINT AS ts_ms
    FROM batch
) AS event
WHERE coalesce(({predicate}), false)
ORDER BY idx
"""


class EventFilter:
    """Which records of a batch a sink delivers (see the module docstring)."""

    def __init__(self, sink: str, predicate: str) -> None:
        self.sink = sink
        self.predicate = predicate
        self._sql = _EVENT.format(predicate=predicate)
        self._connection = duckdb.connect()
        self._connection.execute("SET threads = 1")  # a batch is small; the sink's other work needs the CPU
        self.keep([])  # binds the predicate now: a typo fails at start, not at the first event

    def keep(self, records: Sequence[StoredRecord]) -> list[bool]:
        """For each record (none a tombstone), whether the predicate holds for its event."""
        batch = pa.table(
            {
                "idx": pa.array(range(len(records)), pa.int64()),
                "topic": pa.array([r.topic for r in records], pa.string()),
                "partition": pa.array([r.partition for r in records], pa.int32()),
                "offset": pa.array([r.offset for r in records], pa.int64()),
                "timestamp_ms": pa.array([r.timestamp_ms for r in records], pa.int64()),
                "key": pa.array([r.key for r in records], pa.binary()).cast(pa.string()),
                "value": pa.array([r.value for r in records], pa.binary()).cast(pa.string()),
            }
        )
        try:
            self._connection.register("batch", batch)
            chosen = self._connection.sql(self._sql).fetchall()
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            msg = (
                f"{self.predicate!r} cannot be evaluated on the sink's events: {first}; "
                "read row values as (after->>'column')::TYPE"
            )
            raise SinkConfigError(self.sink, msg, field="filter") from None
        finally:
            self._connection.unregister("batch")
        mask = [False] * len(records)
        for (index,) in chosen:
            mask[index] = True
        return mask

    def close(self) -> None:
        """Close the DuckDB connection."""
        self._connection.close()
