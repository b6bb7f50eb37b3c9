"""``headwater sinks replay NAME --from TIME|OFFSET``: deliver again from a point of the log (a backfill).

The sink's group (and, for a kind that keeps checkpoints in its target, the target's
checkpoints) is moved to the first offset at or after ``TIME`` in every partition of the
sink's topics, or to ``OFFSET`` (0: everything the log still holds; a compacted topic holds
at least each key's latest change). The sink must be stopped (no live member of its group):
a running member would commit its own positions over the new ones. The next ``sinks run``
delivers from there; kinds that are not exactly once deliver the range again (repeats carry
the same ids).
"""

from __future__ import annotations

from collections.abc import Callable

from core.config import ProjectConfig
from log.base import TopicPartition
from log.consumer import DescribesGroups
from log.errors import UnknownGroupError
from log.factory import open_log
from log.topics import sink_group
from sinks.base import StoresCheckpoints
from sinks.errors import SinkConfigError
from sinks.factory import build_sink
from sinks.inputs import resolve_inputs


def replay(
    config: ProjectConfig,
    name: str,
    *,
    from_offset: int | None = None,
    from_time_ms: int | None = None,
    resolve_name: Callable[[str], str] = str,
) -> dict[TopicPartition, int]:
    """Move sink ``name`` to ``from_offset`` or ``from_time_ms`` in every partition; return the new next offsets."""
    if name not in config.sinks:
        raise SinkConfigError(name, f"no such sink in headwater.yaml (sinks: {', '.join(config.sinks) or 'none'})")
    if (from_offset is None) == (from_time_ms is None):
        raise SinkConfigError(name, "give exactly one of --from TIME or --from OFFSET")
    group = sink_group(name)
    log = open_log(config)
    try:
        if isinstance(log, DescribesGroups):
            try:
                members = log.describe_group(group).members
            except UnknownGroupError:
                members = ()
            if members:
                msg = (
                    f"is running ({len(members)} member(s) in group {group}); "
                    "stop it first (a running member would commit over the replay point)"
                )
                raise SinkConfigError(name, msg)
        existing = set(log.list_topics())
        topics = [t for t in resolve_inputs(name, config.sinks[name].from_, existing, resolve_name) if t in existing]
        offsets: dict[TopicPartition, int] = {}
        for topic in topics:
            for partition in range(log.describe_topic(topic).partitions):
                begin, end = log.beginning_offset(topic, partition), log.end_offset(topic, partition)
                if from_time_ms is not None:
                    found = log.offset_for_time(topic, partition, from_time_ms)
                    offset = end if found is None else found
                else:
                    assert from_offset is not None
                    offset = min(max(from_offset, begin), end)
                offsets[TopicPartition(topic, partition)] = offset
        sink = build_sink(config, name, log)
        try:
            if isinstance(sink, StoresCheckpoints):
                sink.open()
                sink.rewind(group, offsets)
        finally:
            sink.close()
        if offsets:
            log.commit(group, offsets)
        return offsets
    finally:
        log.close()
