"""Running sinks: each one a member of its consumer group, delivering batches in order until stopped.

One :class:`SinkRunner` per sink (several run side by side in threads, :func:`run_sinks`):

1. Poll up to ``batch_size`` records of the sink's topics (:mod:`sinks.inputs`) as a member of
   ``headwater.sink.<name>``; the group splits partitions among every process running the sink.
2. Drop tombstones (the delete event before each carries the change), apply ``filter`` and
   ``transform``.
3. Deliver the batch (:class:`sinks.base.Sink`). A target that is down is retried with the same
   batch, with exponential backoff and jitter, for as long as it takes: the sink's state reads
   ``blocked`` meanwhile (:mod:`sinks.state`). Poison records go to the dead-letter topic.
4. Commit: a kind that stores checkpoints wrote them with the records (exactly once); for the
   others the group's offsets are committed only now, so a crash between delivery and commit
   re-delivers the batch (at least once, never a gap). The group's offsets are committed for
   transactional kinds too, after their own commit, so lag shows alike for every sink.

``until_caught_up`` stops once every partition of the sink's topics is processed up to the
end offset it had when the run started; ``follow`` runs until :meth:`SinkRunner.stop`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal, TypeVar, cast

from core import metrics
from core.config import ProjectConfig
from core.errors import HeadwaterError, TransientError, one_line
from core.stop_request import SignalSafeEvent
from log.base import Log, StoredRecord, TopicPartition
from log.consumer import Consumer, ConsumerSettings
from log.errors import FencedMemberError
from log.factory import consumer_of, open_log
from log.table_schemas import latest_schemas
from log.topics import sink_group
from sinks.backoff import Backoff
from sinks.base import PreparesBatches, Sink, StoresCheckpoints
from sinks.dead_letter import DeadLetters
from sinks.errors import SinkConfigError
from sinks.event_filter import EventFilter
from sinks.factory import build_sink
from sinks.inputs import resolve_inputs
from sinks.records import SinkRecord, as_sent
from sinks.state import BLOCKED, FAILED, RUNNING, STOPPED, StateFile
from sinks.transform import Transform, unknown_fields

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: How often a following sink looks for new topics its globs match.
RESOLVE_INTERVAL_S = 5.0
#: How often a sink whose target keeps its checkpoints copies them to its group (for lag).
_SHOW_INTERVAL_S = 1.0
#: How often a sink whose target does not keep checkpoints commits its group's offsets (and on idle, stop, revoke).
_COMMIT_INTERVAL_S = 0.25
#: A sink blocked on its target for hours is still a member (its heartbeats go on): it polls again when it gets through.
_MAX_POLL_INTERVAL_MS = 24 * 3600 * 1000
#: How long a poll waits for the first record (a run that stops at the end waits none once it has read to it).
_POLL_WAIT_S = 0.5


@dataclass
class SinkStats:
    """What one sink did in this run."""

    sink: str
    read: int = 0
    delivered: int = 0
    skipped: int = 0
    dead_lettered: int = 0
    batches: int = 0
    retries: int = 0


@dataclass(frozen=True)
class _Done:
    """A delivered batch, not yet committed."""

    offsets: dict[TopicPartition, int]
    read: int
    delivered: int
    started: float


class _Stopped(Exception):
    """Stop was asked while the sink waited to retry."""


class SinkRunner:
    """Runs one sink (see the module docstring)."""

    def __init__(
        self,
        config: ProjectConfig,
        name: str,
        *,
        resolve_name: Callable[[str], str] = str,
        say: Callable[[str], None] = logger.info,
        stop: threading.Event | None = None,
    ) -> None:
        self.config = config
        self.name = name
        self.spec = config.sinks[name]
        self.group = sink_group(name)
        self.stats = SinkStats(name)
        self._resolve_name = resolve_name
        self._say = say
        self._stop = stop or SignalSafeEvent()
        self._transform = Transform(self.spec.transform)
        self._state = StateFile(config, name)
        self._backoff = Backoff(self.spec.retry.initial_s, self.spec.retry.max_s)
        self._read_backoff = Backoff(self.spec.retry.initial_s, self.spec.retry.max_s)
        self._consumer: Consumer | None = None
        #: Delivered positions not yet copied to the group (kinds keeping checkpoints in their target).
        self._shown: dict[TopicPartition, int] = {}
        self._shown_at = 0.0
        #: The delivery in flight: its future, next offsets, records read and delivered, start time.
        self._in_flight: tuple[Future[None], dict[TopicPartition, int], int, int, float] | None = None
        #: Set inside a poll when finishing a revoked partition's batch found the member fenced.
        self._fenced = False
        self._worker: ThreadPoolExecutor | None = None
        #: The sink of this run and whether it prepares batches and keeps checkpoints (:meth:`_capabilities`).
        self._kind_of: tuple[Sink, bool, bool] | None = None

    def stop(self) -> None:
        """Finish the batch in hand (or stop waiting to retry it) and return."""
        self._stop.set()

    def run(self, *, follow: bool) -> SinkStats:
        """Deliver until caught up (or, with ``follow``, until stopped); returns the counts."""
        log = open_log(self.config)
        sink = build_sink(self.config, self.name, log)
        event_filter = EventFilter(self.name, self.spec.filter) if self.spec.filter else None
        try:
            topics = self._topics(log)
            self._check_fields(log, topics)
            self._until_ready(sink.open, "connecting", self._backoff)
            self._set(RUNNING)
            self._say(f"sink {self.name} ({self.spec.kind}): reading {', '.join(topics) or 'nothing yet'}")
            self._loop(log, sink, event_filter, topics, follow)
        except _Stopped:
            pass
        except HeadwaterError as exc:
            self._set(FAILED, one_line(exc))
            raise
        finally:
            if self._consumer is not None:
                if self._shown:
                    with contextlib.suppress(_Stopped, HeadwaterError):  # a partition lost meanwhile: its owner repeats
                        self._commit(self._consumer, sink, {}, last=True)
                self._consumer.close()
            sink.close()
            if event_filter is not None:
                event_filter.close()
            log.close()
        self._set(STOPPED)
        return self.stats

    # -- the loop -------------------------------------------------------------------------------

    def _loop(self, log: Log, sink: Sink, event_filter: EventFilter | None, topics: list[str], follow: bool) -> None:
        """Poll and prepare batch N+1 while batch N is delivered (one delivery in flight, in order)."""
        dead_letters = DeadLetters(log, self.name, self.config.log.partitions)
        consumer = self._join(log, sink, topics)
        ends = {} if follow else self._ends(log, topics)
        resolved_at = time.monotonic()
        with ThreadPoolExecutor(1, thread_name_prefix=f"sink-{self.name}") as worker:
            self._worker = worker
            try:
                while not self._stop.is_set():
                    if follow and time.monotonic() - resolved_at >= RESOLVE_INTERVAL_S:
                        resolved_at = time.monotonic()
                        now = self._topics(log)
                        if now != topics:
                            self._say(f"sink {self.name}: now reading {', '.join(now)}")
                            topics = now
                            if self._finish(consumer, sink):
                                consumer.subscribe(topics, on_revoke=functools.partial(self._revoked, consumer, sink))
                    if not topics:
                        if not follow:
                            return
                        self._stop.wait(1.0)
                        continue
                    # A run that stops at the end does not wait for more once it has read up to it.
                    wait_s = 0.0 if not follow and self._caught_up(log, consumer, ends) else _POLL_WAIT_S
                    records = self._until_ready(functools.partial(self._poll, consumer, wait_s), "reading the log")
                    batch = self._prepare(sink, records, event_filter) if records else []
                    checkpoints = consumer.checkpoints() if records else {}
                    done = self._settle()
                    if records and done is not False and not self._fenced:
                        # The next delivery starts before the last one's commit: the commit's durable
                        # write overlaps it, and a batch still counts only once its delivery returned.
                        offsets = {tp: c.offset for tp, c in checkpoints.items()}
                        future = worker.submit(self._deliver, sink, batch, checkpoints, dead_letters)
                        self._in_flight = (future, offsets, len(records), len(batch), time.monotonic())
                    if done and not self._fenced and not self._committed(consumer, sink, done):
                        done = False
                    if done is False or self._fenced:
                        # A partition moved to another member (or a target keeping the checkpoints lost
                        # this member's claim): the batch did not count. Join again and start from the
                        # committed (or stored) positions; nothing is skipped.
                        self._fenced = False
                        self._shown.clear()  # positions of partitions this member may no longer own
                        self._drain()  # a delivery started meanwhile is repeated by the partitions' owners
                        consumer = self._join(log, sink, topics)
                        continue
                    if records:
                        continue
                    if self._shown:
                        self._commit(consumer, sink, {}, last=True)  # idle: the group's copy catches up now
                    if not follow and self._caught_up(log, consumer, ends):
                        return
                self._finish(consumer, sink)
            finally:
                self._stop_delivery()

    def _settle(self) -> _Done | Literal[False] | None:
        """Wait for the delivery in flight: what it did (``None``: nothing in flight; False: the member was fenced)."""
        if self._in_flight is None:
            return None
        future, offsets, read, delivered, started = self._in_flight
        self._in_flight = None
        try:
            future.result()
        except FencedMemberError as exc:
            self._say(f"sink {self.name}: {one_line(exc)}; rejoining the group")
            return False
        return _Done(offsets, read, delivered, started)

    def _committed(self, consumer: Consumer, sink: Sink, done: _Done, *, now: bool = False) -> bool:
        """Commit a settled delivery (now, or with the next commit) and count it; False when the member was fenced."""
        try:
            self._commit(consumer, sink, done.offsets, last=now)
        except FencedMemberError as exc:
            self._say(f"sink {self.name}: {one_line(exc)}; rejoining the group")
            return False
        metrics.SINK_BATCH_DURATION.labels(self.name).observe(time.monotonic() - done.started)
        self.stats.batches += 1
        self.stats.read += done.read
        self.stats.delivered += done.delivered
        self.stats.skipped += done.read - done.delivered
        metrics.SINK_RECORDS.labels(self.name).inc(done.delivered)
        metrics.SINK_SKIPPED.labels(self.name).inc(done.read - done.delivered)
        return True

    def _finish(self, consumer: Consumer, sink: Sink) -> bool:
        """Wait for the delivery in flight and commit everything delivered; False when the member was fenced."""
        done = self._settle()
        if done is False:
            return False
        if done is not None and not self._committed(consumer, sink, done, now=True):
            return False
        try:  # what earlier deliveries left to commit (commits are spaced), before partitions change hands
            self._commit(consumer, sink, {}, last=True)
        except FencedMemberError:
            return False
        return True

    def _drain(self) -> None:
        """Wait for a delivery in flight without committing it (the member is joining again)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            with contextlib.suppress(FencedMemberError):
                in_flight[0].result()

    def _revoked(self, consumer: Consumer, sink: Sink, partitions: frozenset[TopicPartition]) -> None:
        """Partitions leave this member (inside a poll): their batch in flight is finished and committed first."""
        if not self._finish(consumer, sink):
            self._fenced = True

    def _stop_delivery(self) -> None:
        """On the way out: a delivery still in flight ends (a retry's wait is cut short by the stop event)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            self._stop.set()
            with contextlib.suppress(BaseException):
                in_flight[0].result()

    def _poll(self, consumer: Consumer, wait_s: float) -> list[StoredRecord]:
        return consumer.poll(timeout_s=wait_s, max_records=self.spec.batch_size)

    def _join(self, log: Log, sink: Sink, topics: list[str]) -> Consumer:
        """A fresh member of the sink's group (the previous one, if any, leaves first)."""
        if self._consumer is not None:
            self._consumer.close()
        settings = ConsumerSettings(max_poll_interval_ms=_MAX_POLL_INTERVAL_MS, max_poll_records=self.spec.batch_size)
        store = sink if isinstance(sink, StoresCheckpoints) else None
        consumer = consumer_of(log, self.group, settings, offset_store=store)  # type: ignore[arg-type]
        self._consumer = consumer
        if topics:
            consumer.subscribe(topics, on_revoke=functools.partial(self._revoked, consumer, sink))
        return consumer

    def _prepare(
        self, sink: Sink, records: Sequence[StoredRecord], event_filter: EventFilter | None
    ) -> list[SinkRecord]:
        """The batch for ``sink``: tombstones dropped, filter and transform applied, and the kind's own preparation.

        Runs on the reading thread, while the batch before is being delivered.
        """
        if event_filter is not None:
            records = [r for r in records if r.value is not None]
            if records:
                records = [r for r, keep in zip(records, event_filter.keep(records), strict=True) if keep]
        if self._transform.identity:
            batch = as_sent(records)  # events go out byte for byte
        else:
            payload = self._transform.payload
            batch = [
                SinkRecord(r.topic, r.partition, r.offset, r.timestamp_ms, r.key, r.value, payload(r.topic, r.value))  # type: ignore[arg-type]
                for r in records
                if r.value is not None
            ]
        return cast(PreparesBatches, sink).prepare(batch) if batch and self._capabilities(sink)[0] else batch

    def _capabilities(self, sink: Sink) -> tuple[bool, bool]:
        """Whether ``sink`` prepares its batches and keeps its checkpoints in its target.

        Checked once per sink: a runtime protocol check costs microseconds, twice per batch.
        """
        known = self._kind_of
        if known is None or known[0] is not sink:
            known = self._kind_of = (sink, isinstance(sink, PreparesBatches), isinstance(sink, StoresCheckpoints))
        return known[1], known[2]

    def _deliver(self, sink: Sink, batch: list[SinkRecord], checkpoints: dict, dead_letters: DeadLetters) -> None:  # type: ignore[type-arg]
        """Deliver one batch, retrying while the target is unavailable (runs on the delivery thread)."""

        def attempt() -> None:
            sink.deliver(batch, checkpoints, dead_letters.append)

        before = dead_letters.count
        self._until_ready(attempt, "delivering", self._backoff)
        metrics.SINK_DEAD_LETTERS.labels(self.name).inc(dead_letters.count - before)
        self.stats.dead_lettered = dead_letters.count

    def _commit(
        self, consumer: Consumer, sink: Sink, offsets: dict[TopicPartition, int], *, last: bool = False
    ) -> None:
        """Record delivered positions in the group: at most every commit interval, and at once when ``last``.

        A commit is a durable write (as long as a small batch): kinds that do not keep checkpoints
        commit at most every :data:`_COMMIT_INTERVAL_S` (a crash repeats what was delivered since,
        at least once as promised); for the others the target holds the real checkpoint and the
        group's copy is only for lag (``status``, ``/metrics``, ``log groups``).
        """
        transactional = self._capabilities(sink)[1]
        self._shown.update(offsets)
        interval = _SHOW_INTERVAL_S if transactional else _COMMIT_INTERVAL_S
        if not self._shown or (not last and time.monotonic() - self._shown_at < interval):
            return
        self._shown_at = time.monotonic()
        pending = dict(self._shown)
        self._shown.clear()
        if not transactional:
            self._until_ready(lambda: consumer.commit(pending), "committing offsets", self._read_backoff)
            return
        try:
            consumer.commit(pending)
        except (FencedMemberError, TransientError, ValueError) as exc:
            logger.debug("sink %s: group commit after the target's skipped: %s", self.name, exc)

    def _until_ready(self, action: Callable[[], T], doing: str, backoff: Backoff | None = None) -> T:
        """``action()``, retried with backoff while it raises a transient error (the sink reads blocked meanwhile).

        Reading the log and delivering run on two threads, each with its own ``backoff``.
        """
        backoff = backoff or self._read_backoff
        while True:
            try:
                result = action()
            except TransientError as exc:
                self.stats.retries += 1
                metrics.SINK_RETRIES.labels(self.name).inc()
                delay = backoff.next_delay()
                self._set(BLOCKED, f"{doing}: {one_line(exc)}")
                if backoff.attempts in (1, 10) or backoff.attempts % 60 == 0:
                    self._say(f"sink {self.name}: blocked {doing} ({one_line(exc)}); retry in {delay:.1f}s")
                if self._stop.wait(delay):
                    raise _Stopped from None
                continue
            if backoff.attempts:
                backoff.reset()
                self._say(f"sink {self.name}: {doing} works again, going on")
                self._set(RUNNING)
            return result

    # -- topics and progress ----------------------------------------------------------------

    def _topics(self, log: Log) -> list[str]:
        existing = set(log.list_topics())
        chosen = resolve_inputs(self.name, self.spec.from_, existing, self._resolve_name)
        return [topic for topic in chosen if topic in existing]

    def _check_fields(self, log: Log, topics: list[str]) -> None:
        fields = self.spec.transform.fields
        if fields is None or not topics:
            return
        schemas = {t: s for t, s in latest_schemas(log).items() if t in topics}
        if not schemas:
            return  # no table topic: nothing to check the names against
        columns = {topic: [c["name"] for c in schema["columns"]] for topic, schema in schemas.items()}
        unknown = unknown_fields(fields, columns)
        if unknown:
            msg = (
                f"names {', '.join(unknown)}, a column of none of its topics "
                f"({', '.join(sorted(schemas))}); fix the name or remove it"
            )
            raise SinkConfigError(self.name, msg, field="transform.fields")

    def _ends(self, log: Log, topics: list[str]) -> dict[TopicPartition, int]:
        return {
            TopicPartition(topic, p): log.end_offset(topic, p)
            for topic in topics
            for p in range(log.describe_topic(topic).partitions)
        }

    def _caught_up(self, log: Log, consumer: Consumer, ends: dict[TopicPartition, int]) -> bool:
        assigned = consumer.assignment()
        committed: dict[str, dict[int, int]] = {}
        for tp, end in ends.items():
            if tp in assigned:
                if consumer.position(tp) < end:
                    return False
                continue
            if tp.topic not in committed:
                committed[tp.topic] = log.committed(self.group, tp.topic)
            begin = log.beginning_offset(tp.topic, tp.partition)
            if max(committed[tp.topic].get(tp.partition, begin), begin) < end:
                return False
        return True

    def _set(self, state: str, error: str | None = None) -> None:
        self._state.set(state, error, delivered=self.stats.delivered, dead_lettered=self.stats.dead_lettered)


def run_sinks(
    config: ProjectConfig,
    names: Sequence[str],
    *,
    follow: bool,
    resolve_name: Callable[[str], str] = str,
    say: Callable[[str], None] = logger.info,
    stop: threading.Event | None = None,
) -> list[SinkStats]:
    """Run ``names`` (every sink by default) side by side, one thread each; the first error is raised after all end.

    ``stop`` ends every sink after its batch in hand.
    """
    unknown = [name for name in names if name not in config.sinks]
    if unknown:
        known = ", ".join(config.sinks) or "none"
        raise SinkConfigError(unknown[0], f"no such sink in headwater.yaml (sinks: {known})")
    stop = stop or SignalSafeEvent()
    runners = [
        SinkRunner(config, name, resolve_name=resolve_name, say=say, stop=stop) for name in names or config.sinks
    ]
    errors: list[BaseException] = []

    def run(runner: SinkRunner) -> None:
        try:
            runner.run(follow=follow)
        except BaseException as exc:
            errors.append(exc)
            stop.set()  # one sink failing for good stops the process; a supervisor restarts or reports it

    threads = [threading.Thread(target=run, args=(r,), name=f"sink-{r.name}", daemon=True) for r in runners]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
    except KeyboardInterrupt:
        stop.set()
        for thread in threads:
            thread.join()
        raise
    if errors:
        raise errors[0]
    return [runner.stats for runner in runners]
