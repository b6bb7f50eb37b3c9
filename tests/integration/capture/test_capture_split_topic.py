"""Split and merge while ``headwater capture --follow`` writes and a consumer group reads (file log).

A real Postgres table is updated continuously (every update of a key adds 1 to its ``v``);
``headwater capture --follow`` appends the changes; three ``group_processes.py member``
processes of one group process each batch exactly once; the test splits and merges the
table's topic at seeded moments and SIGKILLs capture once after a split (its restart resumes
on the split topic: capture's dedupe along each key's chain of partitions). Checked: for
every key the values of ``v`` processed are ``0, 1, 2, ...`` up to its final value, each once
and in order; nothing lands in a sealed partition.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from log.file.backend import FileLog

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tests" / "integration" / "log" / "group_processes.py"
SEED = int(os.environ.get("HEADWATER_FAULT_SEED", "20261121"))
PASSWORD_VAR = "HW_SHARDS_PASSWORD"
KEYS = 40
SETTINGS = json.dumps({"session_timeout_ms": 2000, "heartbeat_interval_ms": 250, "max_poll_records": 10})


def processed_values(path: Path) -> list[bytes]:
    if not path.exists():
        return []
    with sqlite3.connect(path, timeout=30) as db:
        try:
            return [row[0] for row in db.execute("SELECT value FROM processed ORDER BY seq")]
        except sqlite3.OperationalError:
            return []


def test_split_and_merge_while_capture_writes_and_a_group_reads(pg_database, tmp_path):
    rng = random.Random(f"{SEED}:capture-shards")
    name = pg_database.name
    pg_database.execute("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)")
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE t")
    pg_database.execute(f"INSERT INTO t SELECT g, 0 FROM generate_series(1, {KEYS}) g")
    password = pg_database.server.password
    home = tmp_path / "home"
    config = tmp_path / "headwater.yaml"
    source = {
        "dsn": pg_database.dsn.replace(password, "${" + PASSWORD_VAR + "}"),
        "tables": ["public.t"],
        "heartbeat_interval_s": 1,
    }
    body = {"project": "shards", "home": str(home), "log": {"partitions": 2}, "sources": {name: source}}
    config.write_text(orjson.dumps(body).decode())
    env = {**os.environ, "PYTHONPATH": str(ROOT), PASSWORD_VAR: password}
    command = [sys.executable, "-m", "headwater", "--config", str(config)]
    first = subprocess.run(
        [*command, "capture", "--until-caught-up"], env=env, capture_output=True, text=True, timeout=90
    )
    assert first.returncode == 0, first.stderr
    topic = f"{name}.public.t"
    store = tmp_path / "results.sqlite"
    processes: dict[str, subprocess.Popen[str]] = {}

    def start(label: str, args: list[str]) -> None:
        out = open(tmp_path / f"{label}.out", "w")  # noqa: SIM115 - closed with the process
        processes[label] = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)

    def capture() -> None:
        start("capture", [*command, "capture", "--follow", "--no-cleaner"])

    stop = threading.Event()
    updates = [0]

    def update() -> None:
        while not stop.is_set():
            ids = rng.sample(range(1, KEYS + 1), 5)
            with pg_database.connect() as conn:
                for _ in range(20):
                    if stop.is_set():
                        break
                    conn.execute("UPDATE t SET v = v + 1 WHERE id = ANY(%s)", (ids,))
                    conn.commit()
                    updates[0] += 1
            time.sleep(0.01)

    log = FileLog(home / "log")
    writer = threading.Thread(target=update)
    done: list[str] = []
    try:
        capture()
        writer.start()
        time.sleep(1.0)
        actions = ["split", "members", "split", "kill-capture", "merge", "split"]
        for action in actions:
            time.sleep(rng.uniform(0.8, 2.0))
            shards = log.shard_map(topic)
            opened = [s.number for s in shards.open_shards()] if shards else [0, 1]
            if action == "split":
                target = rng.choice(opened)
                split = subprocess.run(
                    [*command, "log", "split", topic, str(target)], env=env, capture_output=True, text=True
                )
                assert split.returncode == 0, split.stderr
                done.append(f"split {target}")
            elif action == "merge":
                i = rng.randrange(len(opened) - 1)
                merge = subprocess.run(
                    [*command, "log", "merge", topic, str(opened[i]), str(opened[i + 1])],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                assert merge.returncode == 0, merge.stderr
                done.append(f"merge {opened[i]} {opened[i + 1]}")
            elif action == "members":
                spec = json.dumps({"config": str(config)})
                for member in ("m0", "m1", "m2"):
                    start(
                        member, [sys.executable, str(SCRIPT), "member", spec, "g", topic, str(store), member, SETTINGS]
                    )
            else:
                processes["capture"].send_signal(signal.SIGKILL)
                processes["capture"].wait()
                done.append("capture killed")
                capture()
        stop.set()
        writer.join()
        [(final,)] = pg_database.execute("SELECT sum(v) FROM t")
        expected = KEYS + int(final)  # the snapshot's row of each key, then one event per increment
        deadline = time.monotonic() + 90
        while len(processed_values(store)) < expected and time.monotonic() < deadline:
            time.sleep(0.3)
        values = processed_values(store)
        outputs = {n: (tmp_path / f"{n}.out").read_text()[-2000:] for n in processes}
        assert len(values) == expected, (done, len(values), expected, outputs)
    finally:
        stop.set()
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    assert updates[0] > 0
    by_key: dict[int, list[int]] = {}
    for value in values:
        after = orjson.loads(value)["after"]
        by_key.setdefault(after["id"], []).append(after["v"])
    rows = dict(pg_database.execute("SELECT id, v FROM t"))
    for key, final_v in rows.items():
        assert by_key[key] == list(range(final_v + 1)), f"key {key}: {by_key[key][:30]}... ({done})"
    shards = log.shard_map(topic)
    assert shards is not None and shards.version == 4
    for shard in shards.shards:
        if not shard.is_open:
            assert log.end_offset(topic, shard.number) == shard.sealed_end
    log.close()
