"""log.group_assignment.balance: one live owner per partition, balanced shares, few moves."""

from hypothesis import given
from hypothesis import strategies as st

from log.base import TopicPartition
from log.group_assignment import balance

members_st = st.lists(st.sampled_from([f"m{i}" for i in range(6)]), min_size=1, max_size=6, unique=True)


def shares(assignment, topic):
    counts = {}
    for tp, member in assignment.items():
        if tp.topic == topic:
            counts[member] = counts.get(member, 0) + 1
    return counts


@given(members=members_st, partitions=st.integers(1, 12), data=st.data())
def test_every_partition_one_subscribed_member_balanced(members, partitions, data):
    subscriptions = {m: frozenset({"a"} | ({"b"} if data.draw(st.booleans()) else set())) for m in members}
    owners = {TopicPartition("a", p): data.draw(st.sampled_from([*members, "gone"])) for p in range(partitions)}
    result = balance(subscriptions, {"a": partitions, "b": 3}, owners)
    assert {tp for tp in result if tp.topic == "a"} == {TopicPartition("a", p) for p in range(partitions)}
    for tp, member in result.items():
        assert tp.topic in subscriptions[member]
    counts = shares(result, "a")
    assert max(counts.values()) - min(counts.get(m, 0) for m in members) <= 1
    readers_of_b = [m for m in members if "b" in subscriptions[m]]
    assert len([tp for tp in result if tp.topic == "b"]) == (3 if readers_of_b else 0)


@given(members=members_st, partitions=st.integers(1, 12))
def test_a_balanced_assignment_stays_as_it_is(members, partitions):
    subscriptions = {m: frozenset({"a"}) for m in members}
    first = balance(subscriptions, {"a": partitions}, {})
    assert balance(subscriptions, {"a": partitions}, first) == first


@given(members=members_st, partitions=st.integers(1, 12))
def test_a_join_moves_only_the_new_members_share(members, partitions):
    subscriptions = {m: frozenset({"a"}) for m in members}
    before = balance(subscriptions, {"a": partitions}, {})
    after = balance({**subscriptions, "new": frozenset({"a"})}, {"a": partitions}, before)
    moved = [tp for tp in before if after[tp] != before[tp]]
    assert len(moved) == shares(after, "a").get("new", 0)
    assert all(after[tp] == "new" for tp in moved)


def test_a_leave_moves_only_the_partitions_of_the_member_that_left():
    subscriptions = {m: frozenset({"a"}) for m in ("m0", "m1", "m2")}
    before = balance(subscriptions, {"a": 6}, {})
    del subscriptions["m1"]
    after = balance(subscriptions, {"a": 6}, before)
    assert [tp for tp in before if after[tp] != before[tp]] == [tp for tp, m in before.items() if m == "m1"]
