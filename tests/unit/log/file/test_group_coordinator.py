"""log.file.group_coordinator: leases, hand-over only after release, epochs as fencing tokens."""

import time
from pathlib import Path

import pytest

from log.base import TopicPartition
from log.errors import FencedMemberError, InvalidGroupNameError
from log.file.group_coordinator import GroupCoordinator, list_group_names

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def coordinator(tmp_path, group="g"):
    return GroupCoordinator(tmp_path, group, lambda topic: 2 if topic == "t" else None)


def test_first_member_owns_everything_a_second_gets_half_after_the_release(tmp_path):
    c = coordinator(tmp_path)
    a = c.join("a", ("t",), 10_000, "client a")
    assert set(a.owned) == {T0, T1} and not a.revoking
    b = c.join("b", ("t",), 10_000, "client b")
    assert b.owned == {}  # nothing changes hands while its owner lives and has not released it
    a = c.heartbeat("a")
    assert len(a.revoking) == 1
    [moving] = a.revoking
    old_epoch = a.owned[moving]
    a = c.release("a", a.revoking)
    assert moving not in a.owned
    b = c.heartbeat("b")
    assert set(b.owned) == {moving}
    assert b.owned[moving] > old_epoch


def test_a_member_whose_lease_ended_loses_its_partitions_at_once(tmp_path):
    c = coordinator(tmp_path)
    c.join("a", ("t",), 200, "a")
    c.join("b", ("t",), 10_000, "b")
    time.sleep(0.3)
    b = c.heartbeat("b")
    assert set(b.owned) == {T0, T1}
    assert c.heartbeat("a") is None  # it must rejoin


def test_fenced_refuses_a_dead_member_and_an_old_epoch(tmp_path):
    c = coordinator(tmp_path)
    a = c.join("a", ("t",), 200, "a")
    ran = []
    with c.fenced("a", a.owned):
        ran.append(1)
    time.sleep(0.3)
    with pytest.raises(FencedMemberError) as lease, c.fenced("a", a.owned):
        ran.append(2)
    assert "lease ended" in str(lease.value) and "\n" not in str(lease.value)
    b = c.join("b", ("t",), 10_000, "b")
    with pytest.raises(FencedMemberError, match="gave it to another member"), c.fenced("b", {T0: b.owned[T0] - 1}):
        ran.append(3)
    assert ran == [1]


def test_leave_hands_partitions_over_at_once_and_epochs_are_never_reused(tmp_path):
    c = coordinator(tmp_path)
    a = c.join("a", ("t",), 10_000, "a")
    c.join("b", ("t",), 10_000, "b")
    c.leave("a")
    b = coordinator(tmp_path).heartbeat("b")  # another process's view of the same state file
    assert set(b.owned) == {T0, T1}
    assert min(b.owned.values()) > max(a.owned.values())
    assert coordinator(tmp_path).state().generation > 0
    assert list_group_names(tmp_path) == ["g"]


def test_group_names_are_checked():
    with pytest.raises(InvalidGroupNameError, match="invalid consumer group name"):
        GroupCoordinator(Path("/tmp"), "a/b", lambda _t: None)
