"""An audited table: a trigger records every change of ``t`` in ``audit``, the truth a captured log must equal.

Used by tests that break things under a running capture (walsender kills, a failover): the
log's events of ``t`` in the source's order must equal the audit rows in ``seq`` order,
``(op, id, v)`` each, and no ``(commit_lsn, txn_index)`` may repeat. One writer connection
at a time makes ``seq`` order the commit order.
"""

from __future__ import annotations

from typing import Any

import psycopg

from harness.conformance import HeadwaterProject

SCHEMA = """
CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, pad text);
CREATE TABLE audit (seq bigserial PRIMARY KEY, op text NOT NULL, id int NOT NULL, v int);
CREATE FUNCTION record_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO audit (op, id, v) VALUES ('d', OLD.id, NULL);
    ELSE
        INSERT INTO audit (op, id, v) VALUES (CASE TG_OP WHEN 'INSERT' THEN 'c' ELSE 'u' END, NEW.id, NEW.v);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER audited AFTER INSERT OR UPDATE OR DELETE ON t FOR EACH ROW EXECUTE FUNCTION record_change();
"""

Change = tuple[str, int, "int | None"]


def run_batch(conn: psycopg.Connection[Any], batch: int, rows: int) -> None:
    """One transaction: ``rows`` inserts (ids ``batch * rows + 1 ...``), updates and deletes of earlier rows."""
    first, last = batch * rows + 1, (batch + 1) * rows
    with conn.transaction():
        conn.execute(f"INSERT INTO t SELECT g, g, repeat(md5(g::text), 4) FROM generate_series({first}, {last}) g")
        conn.execute(f"UPDATE t SET v = v + 1 WHERE id % 7 = {batch % 7} AND id < {first}")
        conn.execute(f"DELETE FROM t WHERE id % 97 = {batch % 97} AND id < {first}")


def audited_changes(dsn: str) -> list[Change]:
    """Every change of ``t`` as the trigger recorded it, in commit order."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [tuple(row) for row in conn.execute("SELECT op, id, v FROM audit ORDER BY seq")]  # type: ignore[misc]


def logged_changes(project: HeadwaterProject, source: str) -> list[tuple[tuple[int, int], Change]]:
    """The log's events of ``t`` as ``((commit_lsn, txn_index), (op, id, v))``, in the source's order."""
    out = []
    for event in project.events(source):
        value = event.value
        if value is None or not event.topic.endswith(".t"):
            continue
        row, after, position = value["after"] or value["before"], value["after"] or {}, value["source"]
        out.append(((position["commit_lsn"], position["txn_index"]), (value["op"], row["id"], after.get("v"))))
    return out


def assert_log_equals_audit(project: HeadwaterProject, source: str, dsn: str) -> int:
    """Nothing lost, nothing twice, nothing out of order; returns the number of changes."""
    expected = audited_changes(dsn)
    got = logged_changes(project, source)
    sequences = [sequence for sequence, _ in got]
    assert len(sequences) == len(set(sequences)), "an event is in the log twice"
    changes = [change for _, change in got]
    if changes != expected:
        missing = [c for c in expected if c not in changes][:5]
        extra = [c for c in changes if c not in expected][:5]
        msg = f"log ({len(changes)}) != audit ({len(expected)}): missing e.g. {missing}, extra e.g. {extra}"
        raise AssertionError(msg)
    return len(expected)
