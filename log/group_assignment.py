"""Which live member of a consumer group owns each partition: balanced, and sticky where balance allows.

A pure function of the members' subscriptions, the topics' partition counts and the
current owners, so every member computing it from the same group state gets the same
answer (the file backend's coordinator, :mod:`log.file.group_coordinator`, runs it under
the group's lock; the Kafka backend leaves assignment to the broker's group protocol).
"""

from __future__ import annotations

from collections.abc import Mapping

from log.base import TopicPartition


def balance(
    subscriptions: Mapping[str, frozenset[str]],
    partitions: Mapping[str, int],
    owners: Mapping[TopicPartition, str],
) -> dict[TopicPartition, str]:
    """Each partition of a subscribed topic → one member subscribed to that topic.

    Per topic, members' shares differ by at most one partition. A member keeps the
    partitions it owns up to its share (fewer partitions change hands on a join or a
    leave); the larger shares go to members that already own more of the topic, then to
    those with fewer partitions so far, then by member id. Topics nobody subscribes to,
    and partitions of topics not in ``partitions``, get no owner.
    """
    result: dict[TopicPartition, str] = {}
    load = dict.fromkeys(subscriptions, 0)
    for topic in sorted(partitions):
        eligible = sorted(member for member, topics in subscriptions.items() if topic in topics)
        if not eligible:
            continue
        count = partitions[topic]
        held = {member: 0 for member in eligible}
        for number in range(count):
            owner = owners.get(TopicPartition(topic, number))
            if owner in held:
                held[owner] += 1
        order = sorted(eligible, key=lambda member: (-held[member], load[member], member))
        share, extra = divmod(count, len(eligible))
        quota = {member: share + (1 if rank < extra else 0) for rank, member in enumerate(order)}
        kept: dict[str, list[int]] = {member: [] for member in eligible}
        free: list[int] = []
        for number in range(count):
            owner = owners.get(TopicPartition(topic, number))
            if owner is not None and owner in kept and len(kept[owner]) < quota[owner]:
                kept[owner].append(number)
            else:
                free.append(number)
        free.reverse()
        for member in order:
            while len(kept[member]) < quota[member]:
                kept[member].append(free.pop())
            for number in kept[member]:
                result[TopicPartition(topic, number)] = member
            load[member] += len(kept[member])
    return result
