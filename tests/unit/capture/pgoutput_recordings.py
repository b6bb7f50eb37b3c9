"""Load the recorded pgoutput bytes in ``data/`` (written by ``record_pgoutput.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from log.pg_types import PgType, TypeRegistry

DATA = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class Recorded:
    lsn: str
    xid: int
    data: bytes


@cache
def recording(name: str) -> tuple[Recorded, ...]:
    with (DATA / name).open() as lines:
        return tuple(Recorded(row["lsn"], row["xid"], bytes.fromhex(row["data"])) for row in map(json.loads, lines))


def registry() -> TypeRegistry:
    return TypeRegistry(PgType.from_json(row) for row in json.loads((DATA / "types.json").read_text()))
