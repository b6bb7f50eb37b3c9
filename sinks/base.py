"""The :class:`Sink` protocol: what every kind does with a batch, and the guarantees it states.

Contract, for every kind (one module or subpackage beside this one, built by :mod:`sinks.factory`):

* **Order.** :meth:`Sink.deliver` writes a batch's records to the target in the order given
  (each partition's in offset order, so each key's changes in the source's order) and
  returns only when the target accepted every record it did not reject. The runner hands
  over one batch at a time, so a key's changes never overtake each other.
* **Failure.** A target that is down or answers "try later" raises
  :class:`~sinks.errors.TargetUnavailableError`; the runner retries the same batch with
  backoff. Records the target may have accepted before the failure are sent again: a
  receiver dedupes by :attr:`~sinks.records.SinkRecord.event_id` (``<topic>/<partition>/<offset>``).
* **Poison records.** A record the target refuses for good (a webhook's 4xx, a row the
  table rejects) is passed to ``reject`` with the reason *before* the delivery counts as
  done (before a transactional kind commits), so it lands in the dead-letter topic and
  the sink goes on with the rest.
* **Checkpoints.** A kind that :class:`StoresCheckpoints` writes ``checkpoints`` (the
  consumer's positions after the batch, with ownership tokens) in the same target
  transaction as the records: exactly once, fenced against a former owner. Other kinds
  ignore them; the runner commits the group's offsets after ``deliver`` returned
  (at least once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from log.base import TopicPartition
from log.consumer import Checkpoint
from sinks.records import Rejection, SinkRecord

#: Where a kind sends the records its target refused for good (the runner's dead-letter topic).
Reject = Callable[[Sequence[Rejection]], None]


@dataclass(frozen=True, slots=True)
class Guarantee:
    """What a kind promises, as ``headwater sinks`` and the README state it."""

    delivery: str
    #: How a receiver recognises a repeat.
    dedupe: str
    ordering: str = "per key: each partition in offset order, one batch at a time"


@runtime_checkable
class Sink(Protocol):
    """A target that receives batches of a sink's records (see the module docstring)."""

    guarantee: Guarantee

    def open(self) -> None:
        """Connect (and create what the options ask for); :class:`~sinks.errors.TargetUnavailableError` if down."""
        ...

    def deliver(
        self, records: Sequence[SinkRecord], checkpoints: Mapping[TopicPartition, Checkpoint], reject: Reject
    ) -> None:
        """Write ``records`` in order; pass poison records to ``reject`` before the delivery is complete."""
        ...

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...


@runtime_checkable
class PreparesBatches(Protocol):
    """A kind with work per batch that needs no connection (parsing its events), done before :meth:`Sink.deliver`.

    The runner calls :meth:`prepare` on its reading thread, while the batch before is being
    delivered, and passes what it returns (the same records, in the same order) to ``deliver``,
    again on every retry; nothing of the target may be touched here.
    """

    def prepare(self, records: list[SinkRecord]) -> list[SinkRecord]:
        """``records`` as ``deliver`` takes them (e.g. a list that also holds each event parsed)."""
        ...


@runtime_checkable
class StoresCheckpoints(Protocol):
    """A sink whose target keeps the group's positions beside the records (:class:`log.offset_store.OffsetStore`).

    The consumer claims each partition it gains in the target and starts from the position
    stored there; :meth:`Sink.deliver` saves ``checkpoints`` in the transaction that writes
    the records, refusing (``FencedMemberError``) a token a newer owner replaced. :meth:`stored`
    lets a consumer of a split topic see whether a sealed parent was processed to its end.
    """

    def claim(self, group: str, owners: Mapping[TopicPartition, str]) -> dict[TopicPartition, int]:
        """Make each token its partition's owner; return the stored next offsets."""
        ...

    def stored(self, group: str, partition: TopicPartition) -> int | None:
        """The next offset stored for ``partition`` without claiming it (``None``: none)."""
        ...

    def rewind(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Store ``offsets`` as the next ones and void every claim (``headwater sinks replay``)."""
        ...
