"""Consumer benchmark: the consumer API's throughput against a plain confluent-kafka consumer, and rebalance time.

Throughput: ``--records`` keyed records (300 bytes of key + value) in a 4-partition topic,
read by one member of a group through :mod:`log.consumer` (``poll`` of up to 10,000
records, a commit after every poll), on the file backend and on Kafka (tansu, memory
storage), and by a bare ``confluent_kafka.Consumer`` (subscribe, ``consume(10000)``) as the
reference, once without commits and once committing synchronously after every ``consume``
as the API's loop does. The clock runs from the first record to
the last, so the group join is reported apart.

Rebalance: three member processes (``tests/integration/log/group_processes.py member``, the
exactly-once member) read a topic a writer keeps appending to; one is SIGKILLed and the
time until the survivors own all its partitions (their ``assigned`` events) is measured;
a new member replaces it before the next trial. Session timeout and heartbeat interval
are the consumer defaults (6 s, 1 s) unless given.

Starts its own tansu; the last line is
``consumer throughput: <file rec/s> (confluent-kafka consumer on tansu: <rec/s>, ratio <r>)``, the
reference being the committing confluent-kafka consumer.

    .venv/bin/python bench/consumer_bench.py [--records N] [--trials N] [--kafka-trials N] [--skip rebalance]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from log_bench import make_records, start_tansu  # noqa: E402

from core.log_config import KafkaConfig  # noqa: E402
from log.base import Log, TopicSpec, append_keyed  # noqa: E402
from log.consumer import ConsumerSettings  # noqa: E402
from log.factory import consumer_of  # noqa: E402
from log.file.backend import FileLog  # noqa: E402
from log.kafka.backend import KafkaLog  # noqa: E402

PARTITIONS = 4
MEMBER_SCRIPT = REPO / "tests" / "integration" / "log" / "group_processes.py"


def fill(log: Log, topic: str, n: int) -> None:
    log.create_topic(TopicSpec(topic, partitions=PARTITIONS, compacted=False))
    records = make_records(n, keys=10_000)
    for i in range(0, n, 1000):
        append_keyed(log, topic, records[i : i + 1000])


def bench_api(label: str, log: Log, topic: str, n: int) -> float:
    """Consume ``n`` records with the consumer API as the only member of a fresh group; records/s."""
    joined = time.perf_counter()
    with consumer_of(log, f"bench-{topic}", ConsumerSettings(), owns_log=True) as consumer:
        consumer.subscribe([topic])
        count, first = 0, 0.0
        while count < n:
            records = consumer.poll(timeout_s=1.0)
            if records and not first:
                first = time.perf_counter()
            count += len(records)
            consumer.commit()
        elapsed = time.perf_counter() - first
    print(f"{label}: {count / elapsed:,.0f} rec/s ({count} records, {elapsed:.2f} s; join {first - joined:.1f} s)")
    return count / elapsed


def bench_confluent(bootstrap: str, topic: str, n: int, *, commit: bool) -> float:
    """The reference: a bare confluent-kafka consumer in a group, consume(10000), a synchronous commit or none."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{topic}-{commit}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
            "fetch.wait.max.ms": 50,
        }
    )
    joined = time.perf_counter()
    consumer.subscribe([topic])
    count, first = 0, 0.0
    while count < n:
        messages = consumer.consume(10_000, timeout=1.0)
        for message in messages:
            if message.error() is None:
                if not first:
                    first = time.perf_counter()
                count += 1
        if commit and messages:
            consumer.commit(asynchronous=False)
    elapsed = time.perf_counter() - first
    consumer.close()
    print(
        f"confluent-kafka consumer on tansu ({'commit per batch' if commit else 'no commits'}): "
        f"{count / elapsed:,.0f} rec/s "
        f"({count} records, {elapsed:.2f} s; join {first - joined:.1f} s)"
    )
    return count / elapsed


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def _owned(path: Path) -> set[int]:
    owned: set[int] = set()
    for event in _events(path):
        if event["event"] == "assigned":
            owned |= set(event["partitions"])
        elif event["event"] == "revoked":
            owned -= set(event["partitions"])
    return owned


def bench_rebalance(label: str, spec: dict[str, Any], log: Log, workdir: Path, trials: int, settings: str) -> None:
    """p50/p99 of the time from a member's SIGKILL until the survivors own all of its partitions."""
    topic, group = f"rebalance-{label}", f"rebalance-{label}"
    log.create_topic(TopicSpec(topic, partitions=6, compacted=False))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    store = workdir / f"{label}.sqlite"
    writer = subprocess.Popen(
        [sys.executable, str(MEMBER_SCRIPT), "writer", json.dumps(spec), topic, "100000000", "100", "1", "0.05"],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    members: dict[str, subprocess.Popen[bytes]] = {}
    counter = 0

    def start() -> str:
        nonlocal counter
        name = f"{label}-m{counter}"
        counter += 1
        out = open(workdir / f"{name}.out", "wb")  # noqa: SIM115 - the process keeps it
        members[name] = subprocess.Popen(
            [sys.executable, str(MEMBER_SCRIPT), "member", json.dumps(spec), group, topic, str(store), name, settings],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        return name

    def settled() -> bool:
        owned = [_owned(workdir / f"{name}.out") for name in members]
        return all(owned) and sorted(p for o in owned for p in o) == list(range(6))

    def wait(condition: Any, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{label}: the group did not settle in {timeout_s}s")
            time.sleep(0.01)

    rng = random.Random(7)
    times: list[float] = []
    try:
        for _ in range(3):
            start()
        for _ in range(trials):
            wait(settled)
            time.sleep(rng.uniform(0.5, 1.5))
            victim = rng.choice(sorted(members))
            lost = _owned(workdir / f"{victim}.out")
            killed_at = time.time()
            members.pop(victim).kill()
            survivors = sorted(members)

            def taken(lost: set[int] = lost, survivors: list[str] = survivors) -> bool:
                return lost <= set().union(*(_owned(workdir / f"{name}.out") for name in survivors))

            wait(taken)
            took = max(
                e["t"]
                for name in survivors
                for e in _events(workdir / f"{name}.out")
                if e["event"] == "assigned" and e["t"] >= killed_at and set(e["partitions"]) & lost
            )
            times.append(took - killed_at)
            start()
    finally:
        for process in [*members.values(), writer]:
            process.send_signal(signal.SIGKILL)
            process.wait()
    times.sort()
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    print(
        f"{label} rebalance after a member's SIGKILL: p50 {statistics.median(times):.2f} s, p99 {p99:.2f} s "
        f"({len(times)} trials, {settings}; all: {', '.join(f'{t:.2f}' for t in times)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--kafka-python-records", type=int, default=100_000)
    parser.add_argument("--trials", type=int, default=10, help="rebalance trials on the file backend")
    parser.add_argument("--kafka-trials", type=int, default=6, help="rebalance trials per Kafka client")
    parser.add_argument("--session-timeout-ms", type=int, default=ConsumerSettings().session_timeout_ms)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=ConsumerSettings().heartbeat_interval_ms)
    parser.add_argument("--skip", default="", help="comma-separated: throughput, rebalance, kafka-python")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    settings = json.dumps(
        {"session_timeout_ms": args.session_timeout_ms, "heartbeat_interval_ms": args.heartbeat_interval_ms}
    )
    tansu, bootstrap = start_tansu()
    rates: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="hw-consumer-bench-") as tmp:
            root = Path(tmp) / "log"
            if "throughput" not in skip:
                with FileLog(root) as log:
                    fill(log, "bench", args.records)
                rates["file"] = bench_api("consumer API, file backend", FileLog(root), "bench", args.records)
                for client in ("confluent-kafka", "kafka-python"):
                    if client in skip:
                        continue
                    n = args.records if client == "confluent-kafka" else args.kafka_python_records
                    config = KafkaConfig(bootstrap_servers=bootstrap, client=client)  # type: ignore[arg-type]
                    with KafkaLog(config) as log:
                        fill(log, f"bench-{client}", n)
                    label = f"consumer API, {client} on tansu"
                    rates[client] = bench_api(label, KafkaLog(config), f"bench-{client}", n)
                with KafkaLog(KafkaConfig(bootstrap_servers=bootstrap)) as log:
                    fill(log, "bench-raw", args.records)
                bench_confluent(bootstrap, "bench-raw", args.records, commit=False)
                rates["reference"] = bench_confluent(bootstrap, "bench-raw", args.records, commit=True)
            if "rebalance" not in skip:
                with FileLog(root) as log:
                    spec = {"backend": "file", "root": str(root)}
                    bench_rebalance("file", spec, log, Path(tmp), args.trials, settings)
                for client in ("confluent-kafka", "kafka-python"):
                    if client in skip:
                        continue
                    config = KafkaConfig(bootstrap_servers=bootstrap, client=client)  # type: ignore[arg-type]
                    with KafkaLog(config) as log:
                        spec = {"backend": "kafka", "bootstrap": bootstrap, "client": client}
                        bench_rebalance(client, spec, log, Path(tmp), args.kafka_trials, settings)
    finally:
        tansu.terminate()
        tansu.wait(timeout=10)
    if "file" in rates and "reference" in rates:
        print(
            f"consumer throughput: {rates['file']:,.0f} rec/s (confluent-kafka consumer on tansu: "
            f"{rates['reference']:,.0f} rec/s, ratio {rates['file'] / rates['reference']:.2f})"
        )


if __name__ == "__main__":
    main()
