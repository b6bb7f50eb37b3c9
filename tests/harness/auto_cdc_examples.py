"""The Databricks AUTO CDC documentation's example change feed, shared by the SCD golden tests,
and the change tables built from rows of its shape (userId, name, city, operation, sequenceNum)."""

from __future__ import annotations

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


def scd2_table(rows: pa.Table) -> list[tuple[Any, ...]]:
    def num(value: str | None) -> int | None:
        return None if value is None else Sequence.from_sortable(value).commit_lsn

    versions = [(r["userId"], r["name"], r["city"], num(r[START_AT]), num(r[END_AT])) for r in rows.to_pylist()]
    return sorted(versions, key=lambda v: (v[0], v[3]))
