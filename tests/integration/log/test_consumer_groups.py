"""Consumer groups with real processes, on both backends: exactly-once processing through rebalances, fencing.

Members are ``group_processes.py member`` processes that process each batch exactly once
(results and checkpoints in one SQLite transaction, :mod:`log.offset_store`); a writer
process appends keyed records meanwhile; members are SIGKILLed and added at seeded
moments (``HEADWATER_FAULT_SEED``). Checked: every record processed exactly once, each
partition's records processed in offset order, and a record handed to two members only
when the first was killed before its transaction committed (never to two live owners).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.topics import partition_records

from core.log_config import KafkaConfig
from log.base import Record, TopicSpec, append_keyed
from log.file.backend import FileLog
from log.file.group_coordinator import GROUPS_DIRECTORY
from log.kafka.backend import KafkaLog

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("group_processes.py")
REPO = Path(__file__).resolve().parents[3]
SEED = int(os.environ.get("HEADWATER_FAULT_SEED", "20261121"))
#: tansu joins take about half the session timeout; 6 s keeps them near 3 s (tests/harness/broker.py).
SETTINGS = {
    "file": {"session_timeout_ms": 2000, "heartbeat_interval_ms": 250},
    "kafka": {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500},
}


class Group:
    """A log spec for the processes, a Log for the test, and the processes started (stopped at the end)."""

    def __init__(self, backend: str, spec: dict[str, Any], log: Any, workdir: Path) -> None:
        self.backend = backend
        self.kind = "file" if backend == "file" else "kafka"
        self.spec = spec
        self.log = log
        self.workdir = workdir
        self.processes: dict[str, subprocess.Popen[str]] = {}
        #: Processes of ``group_processes.py``: they dump their threads' stacks on SIGUSR2 (faulthandler).
        self.dumps_stacks: set[str] = set()
        self.killed: set[str] = set()

    def start(self, role: str, name: str, *args: str) -> subprocess.Popen[str]:
        out = open(self.workdir / f"{name}.out", "w")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            [sys.executable, str(SCRIPT), role, json.dumps(self.spec), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        self.processes[name] = process
        self.dumps_stacks.add(name)
        return process

    def member(self, name: str, group: str, topic: str) -> None:
        settings = json.dumps(SETTINGS[self.kind])
        self.start("member", name, group, topic, str(self.workdir / "results.sqlite"), name, settings)

    def events(self, name: str) -> list[dict[str, Any]]:
        lines = (self.workdir / f"{name}.out").read_text().splitlines()
        found = []
        for line in lines:
            if line.startswith("{"):
                found.append(json.loads(line))
        return found

    def output(self, name: str) -> str:
        err = self.workdir / f"{name}.err"
        return (self.workdir / f"{name}.out").read_text() + (err.read_text() if err.exists() else "")

    def kill(self, name: str) -> None:
        self.processes[name].send_signal(signal.SIGKILL)
        self.processes[name].wait()
        self.killed.add(name)

    def pause(self, name: str, group: str) -> None:
        """SIGSTOP ``name`` between its calls to the group: on the file backend never inside the group's lock.

        A member frozen while it holds ``+groups/<group>.lock`` (a heartbeat: milliseconds)
        holds up every other member until it resumes (log.file.group_coordinator). Holding
        the lock here until every thread of the member has stopped freezes it outside.
        """
        process = self.processes[name]
        with self._group_lock(group):
            process.send_signal(signal.SIGSTOP)
            deadline = time.monotonic() + 30
            while not _stopped(process.pid):
                if time.monotonic() > deadline:
                    pytest.fail(f"{name} did not stop on SIGSTOP within 30 s")
                time.sleep(0.01)

    @contextlib.contextmanager
    def _group_lock(self, group: str) -> Iterator[None]:
        if self.kind != "file":
            yield  # the broker coordinates: a paused member holds nothing of the group
            return
        fd = os.open(Path(self.spec["root"]) / GROUPS_DIRECTORY / f"{group}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.terminate()
        for name, process in self.processes.items():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.dump_stacks(name)
                process.kill()
                process.wait()
                pytest.fail(f"{name} did not stop on SIGTERM:\n{self.output(name)[-6000:]}")

    def dump_stacks(self, name: str) -> None:
        """Have a hung process write its Python stacks into its output (faulthandler on SIGUSR2)."""
        process = self.processes[name]
        if name not in self.dumps_stacks or process.poll() is not None:
            return  # SIGUSR2 would end a process without the handler, before it says anything
        out = self.workdir / f"{name}.out"
        size = out.stat().st_size
        process.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and out.stat().st_size == size:
            time.sleep(0.05)
        time.sleep(0.2)  # the dump is written thread by thread


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (state ``T`` in ``/proc``)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state == "T" for state in states)


@pytest.fixture(params=["file", "kafka-python", "confluent-kafka"])
def group(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Group]:
    backend = str(request.param)
    if backend == "file":
        spec: dict[str, Any] = {"backend": "file", "root": str(tmp_path / "log")}
        log: Any = FileLog(tmp_path / "log")
    else:
        bootstrap = request.getfixturevalue("log_kafka_bootstrap")
        spec = {"backend": "kafka", "bootstrap": bootstrap, "client": backend}
        log = KafkaLog(KafkaConfig(bootstrap_servers=bootstrap, client=backend))  # type: ignore[arg-type]
    found = Group(backend, spec, log, tmp_path)
    try:
        yield found
    finally:
        found.stop_all()
        log.close()


def wait_for(condition: Any, timeout_s: float, what: str, group: Group) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            for process in group.processes.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGUSR2)  # stacks into its output
            time.sleep(0.5)
            tails = "\n".join(f"--- {n}\n{group.output(n)[-4000:]}" for n in group.processes)
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}\n{tails}")
        time.sleep(0.1)


def processed_rows(group: Group) -> list[tuple[int, int, int, str]]:
    with sqlite3.connect(group.workdir / "results.sqlite", timeout=30) as db:
        return db.execute("SELECT seq, partition, offset, member FROM processed ORDER BY seq").fetchall()


def processed_count(group: Group) -> int:
    path = group.workdir / "results.sqlite"
    if not path.exists():
        return 0
    with sqlite3.connect(path, timeout=30) as db:
        try:
            return int(db.execute("SELECT count(*) FROM processed").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def test_members_killed_and_added_while_a_writer_appends(group: Group, topic_name: str) -> None:
    partitions = 4
    group.log.create_topic(TopicSpec(topic_name, partitions=partitions))
    rng = random.Random(f"{SEED}:{group.backend}")
    name = f"g-{topic_name}"
    live = [f"m{i}" for i in range(3)]
    for member in live:
        group.member(member, name, topic_name)
    wait_for(lambda: all(group.events(m) for m in live), 60, "the members to start", group)
    total, write_s = (4000, 8.0) if group.kind == "file" else (2000, 12.0)
    group.start("writer", "writer", topic_name, str(total), "97", str(SEED), str(write_s / (total / 10.5)))
    # Seeded moments: kills and new members alternate, at least one member always lives.
    actions = ["kill", "add", "kill", "add"] if group.kind == "file" else ["kill", "add"]
    moments = sorted(rng.uniform(0.5, write_s) for _ in actions)
    started = time.monotonic()
    added = 3
    for action, moment in zip(actions, moments, strict=True):
        time.sleep(max(0.0, started + moment - time.monotonic()))
        if action == "kill":
            victim = rng.choice(live)
            group.kill(victim)
            live.remove(victim)
        else:
            member = f"m{added}"
            added += 1
            group.member(member, name, topic_name)
            live.append(member)
    wait_for(lambda: group.processes["writer"].poll() is not None, 120, "the writer to finish", group)
    assert group.processes["writer"].returncode == 0, group.output("writer")
    settle = 60 if group.kind == "file" else 120
    wait_for(lambda: processed_count(group) >= total, settle, f"all {total} records processed", group)
    group.stop_all()

    rows = processed_rows(group)
    ends = {p: group.log.end_offset(topic_name, p) for p in range(partitions)}
    assert sum(ends.values()) == total
    seen: dict[tuple[int, int], int] = {}
    for _, partition, offset, _member in rows:
        seen[(partition, offset)] = seen.get((partition, offset), 0) + 1
    twice = sorted(k for k, n in seen.items() if n > 1)
    assert not twice, f"processed more than once: {twice[:10]}"
    expected = {(p, o) for p, end in ends.items() for o in range(end)}
    assert set(seen) == expected, f"never processed: {sorted(expected - set(seen))[:10]}"
    for partition in range(partitions):
        offsets = [offset for _, p, offset, _ in rows if p == partition]
        assert offsets == sorted(offsets), f"partition {partition} processed out of order"
    # A record handed to two members: only after the first was killed before it committed it.
    handed: dict[tuple[int, int], list[str]] = {}
    for member in group.processes:
        path = group.workdir / f"deliveries-{member}.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                for partition, offset in json.loads(line):
                    handed.setdefault((partition, offset), []).append(member)
    committed_by = {(p, o): m for _, p, o, m in rows}
    for position, members in handed.items():
        others = [m for m in members if m != committed_by[position]]
        assert set(others) <= group.killed, f"{position} handed to live members {members}"
    assert len(group.killed) == actions.count("kill")


def test_a_paused_member_loses_its_partitions_and_its_commit_is_refused(group: Group, topic_name: str) -> None:
    group.log.create_topic(TopicSpec(topic_name, partitions=2))
    append_keyed(group.log, topic_name, [Record(b"k%d" % i, b"%d" % i) for i in range(50)])
    name = f"g-{topic_name}"
    settings = json.dumps(SETTINGS[group.kind])
    zombie = group.start("paused-member", "zombie", name, topic_name, settings)
    wait_for(lambda: any(e["event"] == "owns" for e in group.events("zombie")), 60, "the member to own", group)
    assert next(e for e in group.events("zombie") if e["event"] == "owns")["partitions"] == [0, 1]
    group.pause("zombie", name)
    group.member("heir", name, topic_name)

    def heir_owns_all() -> bool:
        owned: set[int] = set()
        for event in group.events("heir"):
            if event["event"] == "assigned":
                owned |= set(event["partitions"])
            elif event["event"] == "revoked":
                owned -= set(event["partitions"])
        return owned == {0, 1}

    wait_for(heir_owns_all, 60, "the new member to own both partitions", group)
    wait_for(lambda: processed_count(group) >= 50, 60, "the new member to process the records", group)
    zombie.send_signal(signal.SIGUSR1)  # delivered when it continues: it tries to commit what it read
    zombie.send_signal(signal.SIGCONT)
    wait_for(
        lambda: any(e["event"].startswith("commit") for e in group.events("zombie")), 60, "the zombie's commit", group
    )
    outcome = next(e for e in group.events("zombie") if e["event"].startswith("commit"))
    assert outcome["event"] == "commit refused", outcome
    assert outcome["type"] == "FencedMemberError"
    assert "\n" not in outcome["error"] and "no longer owns" in outcome["error"]
    # Nothing the zombie read counts; the heir processed every record once.
    wait_for(lambda: any(e["event"] == "rejoined" for e in group.events("zombie")), 90, "the zombie to rejoin", group)
    group.stop_all()
    rows = processed_rows(group)
    assert sorted((p, o) for _, p, o, _ in rows) == sorted(
        (p, r.offset) for p in range(2) for r in partition_records(group.log, topic_name, p, offset=0)
    )


def _printed(path: Path) -> list[tuple[int, int]]:
    return [(line["partition"], line["offset"]) for line in map(json.loads, path.read_text().splitlines())]


def test_tails_in_a_group_split_the_partitions_and_commit_what_they_printed(group: Group, topic_name: str) -> None:
    """``headwater log tail TOPIC --follow --group G``: members share the partitions, each record printed once."""
    if group.backend == "confluent-kafka":
        pytest.skip("the CLI uses the configured client; kafka-python covers the Kafka backend here")
    project = group.workdir / "project"
    project.mkdir()
    if group.kind == "file":
        (project / "headwater.yaml").write_text(f"project: p\nhome: {group.workdir}\n")
    else:
        (project / "headwater.yaml").write_text(
            f"project: p\nlog:\n  backend: kafka\n  kafka: {{bootstrap_servers: '{group.spec['bootstrap']}'}}\n"
        )
    group.log.create_topic(TopicSpec(topic_name, partitions=4))
    append_keyed(group.log, topic_name, [Record(b'{"k":%d}' % i, b'{"v":%d}' % i) for i in range(40)])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    name = f"g-{topic_name}"
    tails = {}
    for member in ("tail-a", "tail-b"):
        out = open(group.workdir / f"{member}.out", "w")  # noqa: SIM115 - closed with the process
        tail = ["log", "tail", topic_name, "--follow", "--group", name, "--from-beginning", "--json"]
        tails[member] = subprocess.Popen(
            [sys.executable, "-m", "headwater", *tail],
            cwd=project,
            env=env,
            stdout=out,
            stderr=open(group.workdir / f"{member}.err", "w"),  # noqa: SIM115
        )
        group.processes[member] = tails[member]  # type: ignore[assignment]
        time.sleep(0.5)

    def both_printed(count: int) -> bool:
        printed = [_printed(group.workdir / f"{m}.out") for m in tails]
        return sum(map(len, printed)) >= count and all(printed)

    wait_for(lambda: sum(len(_printed(group.workdir / f"{m}.out")) for m in tails) >= 40, 90, "the records", group)

    def two_members() -> bool:
        members = group.log.describe_group(name).members
        return len(members) == 2 and (group.kind == "kafka" or all(m.assignment for m in members))

    wait_for(two_members, 60, "both tails in the group", group)
    if group.kind == "kafka":
        time.sleep(2.0)  # tansu does not report assignments: let the rebalance finish
    append_keyed(group.log, topic_name, [Record(b'{"k":%d}' % i, b'{"v":%d}' % (100 + i)) for i in range(40)])
    wait_for(lambda: both_printed(80), 60, "the new records", group)
    for process in tails.values():
        process.send_signal(signal.SIGINT)
    for member, process in tails.items():
        assert process.wait(timeout=30) == 0, (group.workdir / f"{member}.err").read_text()
    printed = [position for m in tails for position in _printed(group.workdir / f"{m}.out")]
    ends = {p: group.log.end_offset(topic_name, p) for p in range(4)}
    assert sorted(printed) == sorted((p, o) for p, end in ends.items() for o in range(end))
    assert {p for m in tails for p, _ in _printed(group.workdir / f"{m}.out")} == {0, 1, 2, 3}
    assert group.log.committed(name, topic_name) == ends  # each committed what it printed
