"""The Databricks AUTO CDC documentation's example change feed, shared by the SCD golden tests,
and the change tables built from rows of its shape (userId, name, city, operation, sequenceNum)."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa

from log.sequence import Sequence
from warehouse_loader.changes import COMMIT_TS, END_AT, OP, SEQ, START_AT

#: userId, name, city, operation, sequenceNum: verbatim from the documentation.
DOC_FEED = [
    (124, "Raul", "Oaxaca", "INSERT", 1),
    (123, "Isabel", "Monterrey", "INSERT", 1),
    (125, "Mercedes", "Tijuana", "INSERT", 2),
    (126, "Lily", "Cancun", "INSERT", 2),
    (123, None, None, "DELETE", 6),
    (125, "Mercedes", "Guadalajara", "UPDATE", 6),
    (125, "Mercedes", "Mexicali", "UPDATE", 5),
    (123, "Isabel", "Chihuahua", "UPDATE", 5),
]

KEYS = ["userId"]
_OPS = {"INSERT": "c", "UPDATE": "u", "DELETE": "d", "TRUNCATE": "t"}

DOC_TRUNCATE = (None, None, None, "TRUNCATE", 3)


def seq(n: int) -> str:
    return Sequence(n, 0).sortable()


def changes(rows: list[tuple[Any, ...]]) -> pa.Table:
    return pa.table(
        {
            "userId": pa.array([r[0] for r in rows], pa.int64()),
            "name": pa.array([r[1] for r in rows], pa.string()),
            "city": pa.array([r[2] for r in rows], pa.string()),
            SEQ: pa.array([seq(r[4]) for r in rows], pa.string()),
            OP: pa.array([_OPS.get(r[3], r[3]) for r in rows], pa.string()),
            COMMIT_TS: pa.array([r[4] * 1_000_000 for r in rows], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        }
    )


def random_batches(seed: int, count: int) -> list[pa.Table]:
    """``count`` batches of up to 11 changes of 40 keys: updates, deletes, re-inserts, a fifth late, some null names."""
    rng = random.Random(seed)
    sequence = 10
    out = []
    for _ in range(count):
        rows, used = [], set()
        for _ in range(rng.randrange(1, 12)):
            key = rng.randrange(40)
            sequence += rng.randrange(1, 4)
            late = sequence - rng.randrange(0, 3) * 7 if rng.random() < 0.2 else sequence
            if (key, late) in used:
                continue
            used.add((key, late))
            op = rng.choice(["INSERT", "UPDATE", "UPDATE", "DELETE"])
            name = None if rng.random() < 0.15 else f"n{rng.randrange(1000)}"
            rows.append((key, name, f"c{rng.randrange(5)}", op, late))
        out.append(changes(rows))
    return out


def scd2_table(rows: pa.Table) -> list[tuple[Any, ...]]:
    def num(value: str | None) -> int | None:
        return None if value is None else Sequence.from_sortable(value).commit_lsn

    versions = [(r["userId"], r["name"], r["city"], num(r[START_AT]), num(r[END_AT])) for r in rows.to_pylist()]
    return sorted(versions, key=lambda v: (v[0], v[3]))


def stream(seed: int, count: int = 400, keys: int = 60) -> list[tuple[Any, ...]]:
    """Changes (userId, name, city, op, sequence) in arrival order: shuffled, some duplicated, one truncate."""
    rng = random.Random(seed)
    out: list[tuple[Any, ...]] = []
    live: set[int] = set()
    for n in range(1, count + 1):
        key = rng.randrange(keys)
        if n == count // 2:
            out.append((None, None, None, "TRUNCATE", n))
            live.clear()
        elif key in live and rng.random() < 0.2:
            out.append((key, None, None, "DELETE", n))
            live.discard(key)
        else:
            out.append(
                (key, f"n{n}", rng.choice(["Oaxaca", "Lima", "Quito", None]), "UPDATE" if key in live else "INSERT", n)
            )
            live.add(key)
    arrival = out[:]
    for i in range(0, len(arrival) - 3, 7):  # late changes: swap neighbours
        arrival[i], arrival[i + 2] = arrival[i + 2], arrival[i]
    return arrival + rng.sample(out, 20)  # duplicate deliveries


def expected_scd1(events: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    ordered = sorted(set(events), key=lambda e: e[4])
    state: dict[int, tuple[Any, ...]] = {}
    for key, name, city, op, _ in ordered:
        if op == "TRUNCATE":
            state.clear()
        elif op == "DELETE":
            state.pop(key, None)
        else:
            state[key] = (key, name, city)
    return sorted(state.values())


def batches(events: list[tuple[Any, ...]], size: int = 60) -> list[pa.Table]:
    return [changes(events[i : i + size]) for i in range(0, len(events), size)]
