"""The columns a re-read selects: the table's shape as the stream has it, by column number.

A re-read after a schema change is placed at that change's position (SCD2 opens the changed
rows' versions there, :mod:`log.schema_history`), so it must show the rows in the shape of the
schema version that asked for it. While streaming goes on that is the catalog's shape. When
capture was stopped across several DDLs, the stream replays an earlier one's Relation while the
catalog already holds a later state: reading the catalog's columns would put a later DDL's
values (a column added after, its default) at the earlier DDL's position, and the later DDL's
own re-read would then find nothing changed. So the re-read selects the stream's columns under
their current names (matched by ``attnum`` through the topic's latest schema record), as long
as each still exists with the same type; otherwise it reads the catalog's columns as before.
The schema watch holds back the later version until the re-read is done
(:mod:`capture.postgres.streaming.schema_watch`), so its values land before that version starts.
"""

from __future__ import annotations

from typing import Any

import psycopg

from capture.postgres.catalog_state import read_tables
from capture.postgres.decoding.pgoutput_messages import Relation
from capture.postgres.events.builder import EventBuilder


def streamed_columns(conn: psycopg.Connection[Any], builder: EventBuilder, relation: Relation) -> list[str] | None:
    """The current names of the stream's columns of ``relation``'s table, in the stream's order.

    ``relation``: the table as the catalog holds it now. None when the stream's shape is the
    catalog's, or cannot be matched to it column by column (read the catalog's columns then).
    """
    shape = builder.relations.tables.get(relation.oid)
    if shape is None:
        return None
    streamed = shape.relation.columns
    if [(c.name, c.type_oid, c.atttypmod) for c in streamed] == [
        (c.name, c.type_oid, c.atttypmod) for c in relation.columns
    ]:
        return None
    record = builder.relations.latest_schema(shape.topic) or {}
    numbers = {str(c["name"]): int(c["attnum"]) for c in record.get("columns", ()) if "attnum" in c}
    table = read_tables(conn, [relation.oid]).get(relation.oid)
    if table is None:
        return None
    live = {c.attnum: c for c in table.columns}
    names = []
    for column in streamed:
        attnum = numbers.get(column.name)
        now = live.get(attnum) if attnum is not None else None
        if now is None or (now.type_oid, now.typmod) != (column.type_oid, column.atttypmod):
            return None
        names.append(now.name)
    return names
