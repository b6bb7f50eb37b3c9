"""The signal table's orders (Debezium's source signaling channel), for every source kind.

A signal is a row inserted into the source's ``signal_table`` (columns ``id``, ``type``,
``data``; ``data`` JSON), read from the source's change stream, so it takes effect in commit
order with the changes around it, once its transaction is in the log. Types (``data`` as
Debezium's):

* ``execute-snapshot``: ``{"data-collections": ["schema.table", ...], "type": "incremental",
  "additional-conditions": [{"data-collection": "schema.table", "filter": "<SQL condition>"}]}``
  queues an incremental snapshot of those tables (:mod:`capture.incremental_queue`). Table names
  are exact (Debezium also takes regular expressions); ``blocking`` snapshots are not supported.
* ``stop-snapshot``: ``{"data-collections": [...], "type": "incremental"}`` drops those tables
  (all without ``data-collections``) from the incremental snapshots queued or running.
* ``pause-snapshot`` / ``resume-snapshot``: incremental snapshots wait, or go on.
* ``log``: ``{"message": "..."}`` is written to the agent's log.

A signal that cannot be carried out is refused in one line in the agent's log and the kind
writes the same line back to the signal table as a ``log`` signal; capture goes on. Its position
is saved with the state it changes (:class:`capture.incremental_queue.IncrementalState`), so a
transaction read again after a crash neither repeats nor loses it. What is kind-specific (how a
table name is checked and spelled, how a refusal is written back) is a :class:`SignalSource`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from capture.errors import CaptureError
from capture.incremental_queue import IncrementalQueue, SnapshotTable
from core.errors import PermanentError
from log.sequence import Sequence as Seq

logger = logging.getLogger(__name__)

#: The columns of a signal table (Debezium's).
SIGNAL_COLUMNS = ("id", "type", "data")
KNOWN_TYPES = "execute-snapshot, stop-snapshot, pause-snapshot, resume-snapshot, log"
_MAX_QUOTED = 200


class SignalError(CaptureError, PermanentError):
    """A signal that cannot be carried out; it is refused and capture goes on."""


@dataclass(frozen=True)
class Signal:
    """One row inserted into the signal table, at its position in the source's order."""

    id: str
    type: str
    data: str | None
    sequence: Seq


class SignalSource(Protocol):
    """What a source kind does for the signals of its signal table."""

    source: str

    def check_table(self, name: str, condition: str | None) -> None:
        """Raise :class:`SignalError` unless ``name`` can be snapshotted (``condition``: its additional one)."""

    def canonical(self, name: str) -> str:
        """``name`` as the kind's incremental snapshots write table names."""

    def refuse(self, signal: Signal, line: str) -> None:
        """Write ``line`` back to the signal table as a ``log`` signal (failures logged, not raised)."""


def act(signals: Sequence[Signal], incremental: IncrementalQueue, kind: SignalSource) -> None:
    """Carry out each signal not carried out before; refuse (log, write back) those that cannot be."""
    for signal in signals:
        if incremental.last_signal is not None and signal.sequence <= incremental.last_signal:
            continue  # carried out before a crash: its transaction was read again
        # Saved together with what the signal changes (a queued snapshot, a pause), so a crash
        # never carries out such a signal twice; a log line may be written twice.
        before = incremental.last_signal
        incremental.carrying_out(signal.sequence)
        try:
            carry_out(signal, incremental, kind)
        except SignalError as exc:
            line = f"signal {quoted(signal.id)} ({quoted(signal.type)}) refused: {exc}"
            logger.warning("source %s: %s", kind.source, line)
            kind.refuse(signal, line)
        except BaseException:
            incremental.carrying_out(before)  # the connection was lost: carried out when read again
            raise
        incremental.signal_done()


def carry_out(signal: Signal, incremental: IncrementalQueue, kind: SignalSource) -> None:
    """Carry out one signal (see the module docstring); :class:`SignalError` when it cannot be."""
    source = kind.source
    if signal.type == "log":
        message = signal_data(signal).get("message")
        if not isinstance(message, str):
            msg = "a log signal's data needs a 'message' string"
            raise SignalError(msg)
        logger.info("source %s: signal %s: %s", source, signal.id, message)
    elif signal.type == "execute-snapshot":
        tables = snapshot_tables(signal_data(signal), kind)
        incremental.request(tables, signal.id)
        logger.info(
            "source %s: signal %s: incremental snapshot of %s queued",
            source,
            signal.id,
            ", ".join(t.table for t in tables),
        )
    elif signal.type == "stop-snapshot":
        data = signal_data(signal)
        incremental_only(data)
        names = data.get("data-collections")
        stopped = incremental.stop(None if names is None else [kind.canonical(n) for n in table_names(names)])
        logger.info("source %s: signal %s: incremental snapshot stopped (%s)", source, signal.id, stopped)
    elif signal.type in ("pause-snapshot", "resume-snapshot"):
        incremental.pause(signal.type == "pause-snapshot")
        logger.info("source %s: signal %s: incremental snapshots %sd", source, signal.id, signal.type[:-9])
    else:
        msg = f"unknown signal type {quoted(signal.type)} (known: {KNOWN_TYPES})"
        raise SignalError(msg)


def snapshot_tables(data: Mapping[str, Any], kind: SignalSource) -> list[SnapshotTable]:
    """The tables (and additional conditions) of an ``execute-snapshot`` signal's data, each checked."""
    incremental_only(data)
    names = table_names(data.get("data-collections"))
    if not names:
        msg = "execute-snapshot needs 'data-collections', a list of schema.table names"
        raise SignalError(msg)
    conditions: dict[str, str] = {}
    extra = data.get("additional-conditions") or []
    if not isinstance(extra, list) or not all(isinstance(c, dict) for c in extra):
        msg = "'additional-conditions' must be a list of {data-collection, filter} objects"
        raise SignalError(msg)
    for entry in extra:
        table, condition = entry.get("data-collection"), entry.get("filter")
        if not isinstance(table, str) or not isinstance(condition, str) or not condition.strip():
            msg = "each additional condition needs a 'data-collection' and a non-empty 'filter'"
            raise SignalError(msg)
        if table not in names:
            msg = f"additional condition for {quoted(table)}, which is not in 'data-collections'"
            raise SignalError(msg)
        conditions[table] = condition
    for name in names:
        kind.check_table(name, conditions.get(name))
    return [SnapshotTable(kind.canonical(name), conditions.get(name)) for name in names]


def signal_data(signal: Signal) -> dict[str, Any]:
    """The signal's ``data`` as a JSON object (empty: none)."""
    if signal.data is None or not signal.data.strip():
        return {}
    try:
        data = orjson.loads(signal.data)
    except orjson.JSONDecodeError:
        msg = f"its data {quoted(signal.data)} is not JSON"
        raise SignalError(msg) from None
    if not isinstance(data, dict):
        msg = f"its data {quoted(signal.data)} is not a JSON object"
        raise SignalError(msg)
    return data


def table_names(value: object) -> list[str]:
    """``data-collections``: a list of table names (None: none)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        msg = "'data-collections' must be a list of schema.table names"
        raise SignalError(msg)
    return list(value)


def incremental_only(data: Mapping[str, Any]) -> None:
    """Refuse a snapshot type other than ``incremental``."""
    kind = str(data.get("type", "incremental")).lower()
    if kind != "incremental":
        msg = f"snapshot type {quoted(kind)} is not supported (only 'incremental')"
        raise SignalError(msg)


def quoted(text: str) -> str:
    """``text`` quoted for a refusal line, cut at a few hundred characters."""
    return repr(text if len(text) <= _MAX_QUOTED else text[:_MAX_QUOTED] + "...")
