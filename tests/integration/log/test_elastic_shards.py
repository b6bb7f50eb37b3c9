"""Elastic shards with real processes: split and merge while a writer appends and a consumer group reads.

File backend (Kafka refuses to split: README). A ``group_processes.py writer`` appends keyed
records (value: the sequence number written) in batches; three ``member`` processes of one
group process each batch exactly once (results and checkpoints in one SQLite transaction);
this test process splits and merges partitions at seeded moments (``HEADWATER_FAULT_SEED``),
and SIGKILLs one member and adds another. Checked: every record processed exactly once, no
record in a partition after its seal, and for every key the sequence processed equals the
sequence written.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from log.base import TopicSpec
from log.file.backend import FileLog

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("group_processes.py")
REPO = Path(__file__).resolve().parents[3]
SEED = int(os.environ.get("HEADWATER_FAULT_SEED", "20261121"))
#: Small polls: the members fall behind the writer, so parents still hold a backlog when they are sealed.
SETTINGS = json.dumps({"session_timeout_ms": 2000, "heartbeat_interval_ms": 250, "max_poll_records": 10})
KEYS = 97


def start(workdir: Path, spec: dict[str, str], name: str, role: str, *args: str) -> subprocess.Popen[str]:
    out = open(workdir / f"{name}.out", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), role, json.dumps(spec), *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def processed(workdir: Path) -> list[tuple[int, int, str]]:
    path = workdir / "results.sqlite"
    if not path.exists():
        return []
    with sqlite3.connect(path, timeout=30) as db:
        try:
            return db.execute("SELECT partition, offset, value FROM processed ORDER BY seq").fetchall()
        except sqlite3.OperationalError:
            return []


def test_split_and_merge_while_a_writer_appends_and_a_group_reads(tmp_path: Path) -> None:
    rng = random.Random(f"{SEED}:shards")
    spec = {"backend": "file", "root": str(tmp_path / "log")}
    topic = "shards-t"
    log = FileLog(tmp_path / "log")
    log.create_topic(TopicSpec(topic, partitions=2))
    store = str(tmp_path / "results.sqlite")
    processes: dict[str, subprocess.Popen[str]] = {}
    try:
        total, write_s = 6000, 10.0
        processes["writer"] = start(
            tmp_path, spec, "writer", "writer", topic, str(total), str(KEYS), str(SEED), str(write_s / (total / 10.5))
        )
        # The members start after the first split: its parent holds a backlog they read while the
        # children fill. Then, at seeded moments: another split, a merge of two adjacent open
        # partitions, a split, a member killed and one added.
        actions = ["split", "members", "split", "merge", "kill", "split", "add"]
        moments = [0.8, 1.0, *sorted(rng.uniform(1.5, write_s) for _ in actions[2:])]
        started = time.monotonic()
        done: list[str] = []
        for action, moment in zip(actions, moments, strict=True):
            time.sleep(max(0.0, started + moment - time.monotonic()))
            shards = log.shard_map(topic)
            opened = [s.number for s in shards.open_shards()] if shards else [0, 1]
            if action == "split":
                target = rng.choice(opened)
                log.split_partition(topic, target)
                done.append(f"split {target}")
            elif action == "merge":
                i = rng.randrange(len(opened) - 1)
                log.merge_partitions(topic, opened[i], opened[i + 1])
                done.append(f"merge {opened[i]} {opened[i + 1]}")
            elif action == "members":
                for name in ("m0", "m1", "m2"):
                    processes[name] = start(tmp_path, spec, name, "member", "g", topic, store, name, SETTINGS)
            elif action == "kill":
                processes["m0"].send_signal(signal.SIGKILL)
                processes["m0"].wait()
            else:
                processes["m3"] = start(tmp_path, spec, "m3", "member", "g", topic, store, "m3", SETTINGS)
        writer = processes["writer"]
        assert writer.wait(timeout=120) == 0, (tmp_path / "writer.out").read_text()
        deadline = time.monotonic() + 90
        while len(processed(tmp_path)) < total and time.monotonic() < deadline:
            time.sleep(0.2)
        rows = processed(tmp_path)
        outputs = {n: (tmp_path / f"{n}.out").read_text()[-3000:] for n in processes}
        assert len(rows) == total, (done, len(rows), outputs)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    shards = log.shard_map(topic)
    assert shards is not None and shards.version == 4, done
    positions = [(p, o) for p, o, _ in rows]
    assert len(set(positions)) == total, "a record processed twice"
    for shard in shards.shards:
        if not shard.is_open:
            assert log.end_offset(topic, shard.number) == shard.sealed_end
    by_key: dict[int, list[int]] = {}
    for _, _, value in rows:
        by_key.setdefault(int(value) % KEYS, []).append(int(value))
    for key in range(KEYS):
        assert by_key[key] == list(range(key, total, KEYS)), f"key k{key} processed out of order ({done})"
    log.close()
