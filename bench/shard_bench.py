"""Elastic shards benchmark: how long a writer stalls while a partition is split or merged.

A writer process appends batches of ``--batch`` keyed records (300 bytes of key + value,
fsynced per batch unless ``--fsync never``) to a file-log topic as fast as it can and
records when each append started and how long it took. Meanwhile this process splits an
open partition, then merges two adjacent open ones, ``--cycles`` times each, every
``--every-s`` seconds (each in the same way ``headwater log split`` / ``merge`` does). A
split takes the topic's append lock exclusively, so appends wait while it seals the
partition, creates the children's directories and writes the map (all fsynced).

Reported: the split's and merge's own durations, and the stall: the longest append that
overlapped a split or merge, against the appends that overlapped none (p50, p99, max).
Also the cost of the lock and map check per append batch on a never-split topic, and, for
the decision on the Kafka backend, the share of keys Kafka's partitioner moves when a
topic goes from n to n+1 partitions.

    .venv/bin/python bench/shard_bench.py [--cycles N] [--every-s S] [--batch N] [--fsync always|never]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from log.base import Record, TopicSpec, append_keyed  # noqa: E402
from log.file.backend import FileLog  # noqa: E402
from log.partitioner import partition_for  # noqa: E402

TOPIC = "bench.shards"


def writer(root: str, fsync: str, batch: int, out: str, stop_file: str) -> None:
    """Append until ``stop_file`` exists; write one ``[start, seconds]`` per append to ``out``."""
    log = FileLog(Path(root), fsync="always" if fsync == "always" else "never")
    value = b"v" * 280
    timings: list[tuple[float, float]] = []
    n = 0
    stop = Path(stop_file)
    while not stop.exists():
        records = [Record(b"key-%08d" % ((n + i) % 50_000), value) for i in range(batch)]
        n += batch
        began = time.time()
        t0 = time.perf_counter()
        append_keyed(log, TOPIC, records)
        timings.append((began, time.perf_counter() - t0))
    log.close()
    Path(out).write_text(json.dumps(timings))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lock_cost(root: Path, batches: int) -> float:
    """Microseconds per append batch that the append lock and map check add (a topic never split)."""
    log = FileLog(root, fsync="never")
    log.create_topic(TopicSpec("bench.lock", partitions=1))
    opened = log._open_topic("bench.lock")  # the lock alone, without the append
    assert opened.shards is not None
    t0 = time.perf_counter()
    for _ in range(batches):
        with opened.shards.appending():
            pass
    elapsed = time.perf_counter() - t0
    log.close()
    return elapsed / batches * 1e6


def moved_share(before: int, after: int, keys: int = 100_000) -> float:
    """Share of keys whose Kafka partition changes when a topic goes from ``before`` to ``after`` partitions."""
    moved = sum(1 for i in range(keys) if partition_for(b"key-%d" % i, before) != partition_for(b"key-%d" % i, after))
    return moved / keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=10, help="splits, and as many merges")
    parser.add_argument("--every-s", type=float, default=0.5)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--fsync", choices=["always", "never"], default="always")
    parser.add_argument("--role", default="bench", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.role == "writer":
        root, out, stop_file = options.args
        writer(root, options.fsync, options.batch, out, stop_file)
        return
    with tempfile.TemporaryDirectory(prefix="hw-shard-bench-") as tmp:
        root = Path(tmp) / "log"
        log = FileLog(root)
        log.create_topic(TopicSpec(TOPIC, partitions=4))
        out, stop_file = Path(tmp) / "timings.json", Path(tmp) / "stop"
        process = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--role",
                "writer",
                "--fsync",
                options.fsync,
                "--batch",
                str(options.batch),
                str(root),
                str(out),
                str(stop_file),
            ]
        )
        time.sleep(1.0)  # the writer's baseline before the first split
        windows: list[tuple[str, float, float]] = []
        for _ in range(options.cycles):
            for action in ("split", "merge"):
                time.sleep(options.every_s)
                shards = log.shard_map(TOPIC)
                opened = [s.number for s in shards.open_shards()] if shards else [0, 1, 2, 3]
                began = time.time()
                t0 = time.perf_counter()
                if action == "split":
                    log.split_partition(TOPIC, opened[0])
                else:
                    log.merge_partitions(TOPIC, opened[-2], opened[-1])
                windows.append((action, began, time.perf_counter() - t0))
        time.sleep(options.every_s)
        stop_file.touch()
        process.wait(timeout=60)
        timings = json.loads(out.read_text())
        shards = log.shard_map(TOPIC)
        assert shards is not None
        sealed_ok = all(log.end_offset(TOPIC, s.number) == s.sealed_end for s in shards.shards if not s.is_open)
        log.close()
        cost_us = lock_cost(Path(tmp) / "lock", 20_000)

    def overlaps(start: float, took: float) -> bool:
        return any(start < w_start + w_took and w_start < start + took for _, w_start, w_took in windows)

    during = [took for start, took in timings if overlaps(start, took)]
    outside = [took for start, took in timings if not overlaps(start, took)]
    stalls = []
    for _, w_start, w_took in windows:
        hit = [took for start, took in timings if start < w_start + w_took and w_start < start + took]
        stalls.append(max(hit) if hit else 0.0)
    ms = 1000.0
    print(f"appends: {len(timings)} batches of {options.batch} (fsync {options.fsync}); sealed ends held: {sealed_ok}")
    for action in ("split", "merge"):
        took = [w[2] * ms for w in windows if w[0] == action]
        print(f"{action}: {len(took)} done, p50 {statistics.median(took):.1f} ms, max {max(took):.1f} ms")
    print(
        f"appends not overlapping a split/merge: p50 {percentile(outside, 0.5) * ms:.2f} ms, "
        f"p99 {percentile(outside, 0.99) * ms:.2f} ms, max {max(outside) * ms:.2f} ms"
    )
    print(
        f"appends overlapping a split/merge: {len(during)}, max {max(during, default=0) * ms:.2f} ms; "
        f"per split/merge the longest overlapping append: p50 {statistics.median(stalls) * ms:.2f} ms, "
        f"max {max(stalls) * ms:.2f} ms"
    )
    print(f"append lock + map check per batch (never-split topic): {cost_us:.1f} us")
    for before, after in ((3, 4), (4, 8), (8, 9)):
        print(f"kafka adding partitions {before} -> {after}: {moved_share(before, after):.1%} of 100k keys move")
    print(
        f"writer stall during a split or merge: p50 {statistics.median(stalls) * ms:.1f} ms, "
        f"max {max(stalls) * ms:.1f} ms (appends otherwise p99 {percentile(outside, 0.99) * ms:.1f} ms)"
    )


if __name__ == "__main__":
    main()
