"""A seeded random workload on a typed table with a composite key, and a canonical row form.

Shared by the warehouse and whole-pipeline exactness tests: inserts, re-inserts of deleted
keys, updates that leave a TOASTed column unchanged, updates of it, primary-key changes,
deletes and TRUNCATE; :func:`canonical` gives one text per row for Postgres rows and
warehouse rows with equal values, so tables compare by checksum over every column.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import random
from decimal import Decimal

import orjson
from psycopg.types.json import Jsonb

UTC = dt.UTC
COLUMNS = "region, id, price, seen, doc, nums, meta, feeling"
SCHEMA = """
CREATE TYPE mood AS ENUM ('calm', 'glad', 'cross');
CREATE TABLE items (
    region int, id int, price numeric(12,2), seen timestamptz, doc text, nums int[], meta jsonb, feeling mood,
    PRIMARY KEY (region, id)
);
ALTER TABLE items ALTER COLUMN doc SET STORAGE EXTERNAL;
"""


class Workload:
    """Random changes to ``items``; ``live`` mirrors the keys the table holds."""

    def __init__(self, conn, seed: int) -> None:
        self.conn = conn
        self.rng = random.Random(seed)
        self.live: set[tuple[int, int]] = set()
        self.gone: set[tuple[int, int]] = set()
        self.next_id = 1

    def values(self) -> tuple:
        rng = self.rng
        price = None if rng.random() < 0.1 else Decimal(rng.randint(-(10**11), 10**11)) / 100
        seen = None
        if rng.random() < 0.9:
            micros = rng.randint(0, 40 * 365 * 86400 * 10**6)
            seen = dt.datetime(1990, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=micros)
        nums = None
        if rng.random() < 0.9:
            nums = [rng.choice([None, rng.randint(-(2**31), 2**31 - 1)]) for _ in range(rng.randint(0, 4))]
        meta = None
        if rng.random() < 0.85:
            meta = Jsonb({"n": rng.randint(0, 10**6), "tags": ["é", str(rng.random())], "x": {"f": 1.5, "z": None}})
        feeling = rng.choice([None, "calm", "glad", "cross"])
        return price, seen, nums, meta, feeling

    def doc(self) -> str | None:
        roll = self.rng.random()
        if roll < 0.4:
            return self.rng.randbytes(6000).hex()  # 12 kB, stored out of line (EXTERNAL: TOAST, no compression)
        return None if roll < 0.55 else f"short {self.rng.random()}"

    def insert(self, key: tuple[int, int]) -> None:
        price, seen, nums, meta, feeling = self.values()
        self.conn.execute(
            "INSERT INTO items VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (*key, price, seen, self.doc(), nums, meta, feeling),
        )
        self.live.add(key)
        self.gone.discard(key)

    def new_key(self) -> tuple[int, int]:
        self.next_id += 1
        return self.rng.randint(1, 3), self.next_id

    def pick(self) -> tuple[int, int]:
        return self.rng.choice(sorted(self.live))

    def change(self) -> None:
        """One random change; updates of other columns leave a TOASTed ``doc`` unchanged (not sent)."""
        rng = self.rng
        roll = rng.random()
        if not self.live or roll < 0.3:
            self.insert(self.new_key())
        elif roll < 0.35 and self.gone:
            self.insert(rng.choice(sorted(self.gone)))  # a deleted key comes back
        elif roll < 0.62:
            price, seen, nums, meta, feeling = self.values()
            self.conn.execute(
                "UPDATE items SET price = %s, seen = %s, nums = %s, meta = %s, feeling = %s"
                " WHERE region = %s AND id = %s",
                (price, seen, nums, meta, feeling, *self.pick()),
            )
        elif roll < 0.72:
            self.conn.execute("UPDATE items SET doc = %s WHERE region = %s AND id = %s", (self.doc(), *self.pick()))
        elif roll < 0.82:
            old, new = self.pick(), self.new_key()
            self.conn.execute("UPDATE items SET region = %s, id = %s WHERE region = %s AND id = %s", (*new, *old))
            self.live.discard(old)
            self.gone.add(old)
            self.live.add(new)
        else:
            key = self.pick()
            self.conn.execute("DELETE FROM items WHERE region = %s AND id = %s", key)
            self.live.discard(key)
            self.gone.add(key)

    def transactions(self, count: int) -> None:
        for _ in range(count):
            with self.conn.transaction():
                for _ in range(self.rng.randint(1, 4)):
                    self.change()

    def truncate(self) -> None:
        self.conn.execute("TRUNCATE items")
        self.gone |= self.live
        self.live.clear()


def canonical(row: tuple) -> str:
    """One text per row, the same for a Postgres row and a warehouse row with equal values."""
    region, id_, price, seen, doc, nums, meta, feeling = row
    assert seen is None or seen.tzinfo is not None, f"naive timestamp {seen!r}"
    if isinstance(meta, str):
        meta = orjson.loads(meta)
    return repr(
        (
            region,
            id_,
            None if price is None else str(price),  # keeps the scale: 12.30 stays 12.30
            None if seen is None else seen.astimezone(UTC).isoformat(),
            None if doc is None else (len(doc), hashlib.sha1(doc.encode()).hexdigest()[:16]),
            None if nums is None else tuple(nums),
            None if meta is None else orjson.dumps(meta, option=orjson.OPT_SORT_KEYS).decode(),
            feeling,
        )
    )


def source_rows(pg_database) -> list[str]:
    rows = pg_database.execute("SELECT region, id, price, seen, doc, nums, meta, feeling::text FROM items")
    return sorted(canonical(r) for r in rows)
