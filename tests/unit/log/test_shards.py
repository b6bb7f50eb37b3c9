"""The partition map of elastic shards (log.shards): positions, routing, split, merge, chains."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from log.errors import UnknownPartitionError
from log.partitioner import partition_for
from log.shards import HASH_LIMIT, ShardError, ShardMap, key_position

keys = st.one_of(st.none(), st.binary(max_size=24))


@given(key=keys, n=st.integers(min_value=1, max_value=64))
def test_unsplit_routing_equals_kafkas_partitioner(key, n):
    shards = ShardMap.initial("t", n)
    assert shards.route(key) == partition_for(key, n)
    assert 0 <= key_position(key, n) < shards.space
    assert shards.space >= HASH_LIMIT


def test_initial_ranges_tile_the_space():
    shards = ShardMap.initial("t", 3)
    assert shards.shards[0].lo == 0
    assert all(a.hi == b.lo for a, b in zip(shards.shards, shards.shards[1:], strict=False))
    assert shards.shards[-1].hi == shards.space
    assert not shards.is_split


def test_split_seals_the_parent_and_children_cover_its_range():
    shards = ShardMap.initial("t", 2).split(0, 17)
    parent, low, high = shards.shard(0), shards.shard(2), shards.shard(3)
    assert parent.sealed_end == 17 and parent.children == (2, 3) and not parent.is_open
    assert (low.lo, low.hi, high.lo, high.hi) == (parent.lo, low.hi, low.hi, parent.hi)
    assert low.parents == high.parents == (0,)
    assert shards.count == 4 and shards.is_split and shards.version == 1


def test_split_at_a_given_hash_and_bad_hashes():
    shards = ShardMap.initial("t", 1)
    split = shards.split(0, 0, at=10)
    assert (split.shard(1).lo, split.shard(1).hi, split.shard(2).lo) == (0, 10, 10)
    for at in (0, shards.space, -1):
        with pytest.raises(ShardError, match="outside partition t/0's hash range"):
            shards.split(0, 0, at=at)


def test_split_of_a_sealed_partition_names_its_open_descendants():
    shards = ShardMap.initial("t", 1).split(0, 5)
    with pytest.raises(ShardError, match=r"t/0 is sealed .*descendants \[1, 2\]"):
        shards.split(0, 5)


def test_unknown_partition():
    with pytest.raises(UnknownPartitionError, match=r"partitions 0\.\.1, not 7"):
        ShardMap.initial("t", 2).split(7, 0)


def test_merge_of_adjacent_open_partitions_and_refusals():
    shards = ShardMap.initial("t", 3)
    merged = shards.merge(2, 1, {1: 4, 2: 9})
    child = merged.shard(3)
    assert child.parents == (1, 2) and (child.lo, child.hi) == (shards.shard(1).lo, shards.shard(2).hi)
    assert merged.shard(1).sealed_end == 4 and merged.shard(2).sealed_end == 9
    with pytest.raises(ShardError, match="not adjacent"):
        shards.merge(0, 2, {0: 0, 2: 0})
    with pytest.raises(ShardError, match="with itself"):
        shards.merge(1, 1, {1: 0})
    with pytest.raises(ShardError, match="t/1 is sealed"):
        merged.merge(0, 1, {0: 0, 1: 0})


@given(
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 50), st.integers(0, 2**31)), max_size=12),
    probe=st.lists(keys, min_size=1, max_size=20),
)
def test_every_key_has_one_open_partition_and_its_chain_is_in_number_order(steps, probe):
    shards = ShardMap.initial("t", 3)
    for split, pick, at in steps:
        opened = shards.open_shards()
        if split:
            target = opened[pick % len(opened)]
            if target.hi - target.lo >= 2:
                shards = shards.split(target.number, 0, target.lo + 1 + at % (target.hi - target.lo - 1))
        elif len(opened) > 1:
            i = pick % (len(opened) - 1)
            shards = shards.merge(
                opened[i].number, opened[i + 1].number, {opened[i].number: 0, opened[i + 1].number: 0}
            )
        assert ShardMap.from_json(shards.to_json()) == shards
    opened = shards.open_shards()
    assert opened[0].lo == 0 and opened[-1].hi == shards.space
    assert all(a.hi == b.lo for a, b in itertools.pairwise(opened))
    routed = shards.route_all(probe)
    for key, target in zip(probe, routed, strict=True):
        assert shards.route(key) == target
        chain = shards.chain(key)
        assert chain[-1] == target and chain == sorted(chain)
        assert chain[0] == partition_for(key, 3)
        for older, newer in itertools.pairwise(chain):
            assert older in shards.parents(newer)
