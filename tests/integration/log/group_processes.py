"""Processes for the consumer-group and cleaner tests and the benchmark: writers and group members.

Run as ``python group_processes.py writer|updates|member|paused-member '<log spec json>' ...`` with the repository
on ``PYTHONPATH``. The log spec is ``{"backend": "file", "root": ...}`` or
``{"backend": "kafka", "bootstrap": ..., "client": ...}``, or ``{"config": <headwater.yaml>}``.

The member processes each polled batch exactly once: it appends the batch's positions to
its deliveries file (flushed: what it was handed), then inserts one row per record into
the shared SQLite database's ``processed`` table and stores its checkpoints with
``commit_with_output`` in the same transaction. It prints one JSON line per event
(``assigned``, ``revoked``, ``fenced``, ``committed``) with the wall time.
"""

from __future__ import annotations

import faulthandler
import json
import random
import signal
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from core.config import load_config
from core.log_config import KafkaConfig
from log.base import Log, Record, append_keyed
from log.consumer import ConsumerSettings
from log.errors import FencedMemberError
from log.factory import consumer_of, open_log
from log.file.backend import FileLog
from log.kafka.backend import KafkaLog
from log.offset_store import SqliteOffsetStore, commit_with_output

PROCESSED = """
CREATE TABLE IF NOT EXISTS processed (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    partition INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    value TEXT NOT NULL,
    member TEXT NOT NULL
)
"""


def open_spec(spec: dict[str, Any]) -> Log:
    if "config" in spec:  # the project's log, as capture opens it (log.topics applied)
        return open_log(load_config(spec["config"]))
    if spec["backend"] == "file":
        return FileLog(Path(spec["root"]))
    return KafkaLog(KafkaConfig(bootstrap_servers=spec["bootstrap"], client=spec["client"]))


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({**event, "t": time.time()}) + "\n")
    sys.stdout.flush()


def _stop_event() -> threading.Event:
    """Set by SIGTERM or SIGINT; the main thread only polls it (:func:`_until_set`)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def _until_set(*flags: threading.Event) -> None:
    """Return once a signal handler set one of ``flags``: polled with ``is_set``, never ``wait()``.

    Handlers run in the main thread between bytecodes. ``Event.wait(timeout)`` takes the
    event's non-reentrant lock again after every timeout; a signal handled in that moment
    runs ``set()``, which waits for the lock its own thread holds, forever (CPython 3.11;
    python/cpython#126434 is the same for ``multiprocessing.Event``). The paused member
    then never stopped on SIGTERM. ``is_set`` takes no lock and ``time.sleep`` holds none.
    """
    while not any(flag.is_set() for flag in flags):
        time.sleep(0.1)


def writer(spec: dict[str, Any], topic: str, total: int, keys: int, seed: int, pause_s: float) -> None:
    """Append ``total`` keyed records (value: their sequence number) in batches of 1-20, then exit."""
    rng = random.Random(seed)
    log = open_spec(spec)
    n = 0
    while n < total:
        size = min(rng.randint(1, 20), total - n)
        append_keyed(log, topic, [Record(b"k%d" % ((n + i) % keys), b"%d" % (n + i)) for i in range(size)])
        n += size
        time.sleep(pause_s)
    log.close()
    emit({"event": "written", "records": n})


def updates(spec: dict[str, Any], topic: str, total: int, keys: int, seed: int, pause_s: float) -> None:
    """Append ``total`` changes of ``keys`` keys, one batch at a time; every 7th change of a key deletes it."""
    rng = random.Random(seed)
    log = open_spec(spec)
    n = 0
    while n < total:
        size = min(rng.randint(1, 8), total - n)
        batch = []
        for i in range(size):
            key = (n + i) % keys
            change = (n + i) // keys
            batch.append(Record(b"k%d" % key, None if change % 7 == 6 else b"%d" % (n + i)))
        append_keyed(log, topic, batch)
        n += size
        time.sleep(pause_s)
    log.close()
    emit({"event": "written", "records": n})


def member(spec: dict[str, Any], group: str, topic: str, store_path: str, name: str, settings_json: str) -> None:
    """Process ``topic`` as a member of ``group`` until SIGTERM (see the module docstring)."""
    stop = _stop_event()
    store = SqliteOffsetStore(store_path)
    store.connection.execute(PROCESSED)
    settings = ConsumerSettings(**json.loads(settings_json))
    consumer = consumer_of(open_spec(spec), group, settings, offset_store=store, owns_log=True)

    def assigned(partitions: frozenset[Any]) -> None:
        emit({"event": "assigned", "member": name, "partitions": sorted(tp.partition for tp in partitions)})

    def revoked(partitions: frozenset[Any]) -> None:
        emit({"event": "revoked", "member": name, "partitions": sorted(tp.partition for tp in partitions)})

    consumer.subscribe([topic], on_assign=assigned, on_revoke=revoked)
    emit({"event": "started", "member": name})
    with open(Path(store_path).with_name(f"deliveries-{name}.jsonl"), "a") as deliveries:
        while not stop.is_set():
            records = consumer.poll(timeout_s=0.2)
            if not records:
                continue
            deliveries.write(json.dumps([[r.partition, r.offset] for r in records]) + "\n")
            deliveries.flush()
            try:
                with store.transaction() as db:
                    db.executemany(
                        "INSERT INTO processed (partition, offset, value, member) VALUES (?, ?, ?, ?)",
                        [(r.partition, r.offset, (r.value or b"").decode(), name) for r in records],
                    )
                    commit_with_output(consumer, store, db)
            except FencedMemberError as exc:
                emit({"event": "fenced", "member": name, "error": str(exc)})
                continue
            emit({"event": "committed", "member": name, "records": len(records)})
            with suppress(FencedMemberError):  # the group's offsets, for lag; the store is authoritative
                consumer.commit()
    consumer.close()
    emit({"event": "closed", "member": name})


def paused_member(spec: dict[str, Any], group: str, topic: str, settings_json: str) -> None:
    """Own partitions, read once, then on SIGUSR1 try to commit and report whether it was refused."""
    commit_now = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: commit_now.set())
    stop = _stop_event()
    consumer = consumer_of(open_spec(spec), group, ConsumerSettings(**json.loads(settings_json)), owns_log=True)
    consumer.subscribe([topic])
    while not consumer.assignment() and not stop.is_set():
        consumer.poll(timeout_s=0.2)
    polled = consumer.poll(timeout_s=1.0)
    emit({"event": "owns", "partitions": sorted(tp.partition for tp in consumer.assignment()), "read": len(polled)})
    _until_set(commit_now, stop)
    if stop.is_set():  # stopped before it was asked to commit (the test failed meanwhile)
        consumer.close()
        return
    try:
        consumer.commit()
        emit({"event": "commit accepted"})
    except FencedMemberError as exc:
        emit({"event": "commit refused", "error": str(exc), "type": type(exc).__name__})
    # After the refusal the member carries on: its next polls rejoin the group.
    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline:
        consumer.poll(timeout_s=0.2)
        if consumer.assignment():
            emit({"event": "rejoined", "partitions": sorted(tp.partition for tp in consumer.assignment())})
            break
    _until_set(stop)
    consumer.close()


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # the tests dump stacks of a process that hangs
    role, raw_spec, *rest = sys.argv[1:]
    log_spec = json.loads(raw_spec)
    if role == "writer":
        writer(log_spec, rest[0], int(rest[1]), int(rest[2]), int(rest[3]), float(rest[4]))
    elif role == "updates":
        updates(log_spec, rest[0], int(rest[1]), int(rest[2]), int(rest[3]), float(rest[4]))
    elif role == "member":
        member(log_spec, rest[0], rest[1], rest[2], rest[3], rest[4])
    elif role == "paused-member":
        paused_member(log_spec, rest[0], rest[1], rest[2])
    else:
        raise SystemExit(f"unknown role {role}")
