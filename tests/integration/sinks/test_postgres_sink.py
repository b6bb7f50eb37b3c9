"""The PostgreSQL sink end to end: a live replica in another database equals the source, exactly once.

Two source tables: the audited ``t`` (a trigger on the *replica* records every change the sink
applies, which must be, per key, the source's changes in order with some skipped (a batch folds a
key's changes into its last) and the same last one) and ``items`` (numeric, timestamptz, TOASTed
text, int[], jsonb, an enum; key changes, deletes, a TRUNCATE) compared row by row. A column added
at the source mid-stream appears in the replica. Offsets live in the replica's database.
"""

from __future__ import annotations

import psycopg
from harness.audit import audited_changes
from harness.items_workload import SCHEMA as ITEMS_SCHEMA
from harness.items_workload import Workload, canonical, source_rows

REPLICA_AUDIT = """
CREATE TABLE applied (seq bigserial PRIMARY KEY, op text, id int, v int);
CREATE FUNCTION record_applied() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN INSERT INTO applied (op, id, v) VALUES ('d', OLD.id, NULL);
    ELSE INSERT INTO applied (op, id, v) VALUES (CASE TG_OP WHEN 'INSERT' THEN 'c' ELSE 'u' END, NEW.id, NEW.v);
    END IF;
    RETURN NULL;
END $$;
"""


def replica_rows(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT region, id, price, seen, doc, nums, meta, feeling FROM items").fetchall()
    return sorted(canonical(r) for r in rows)


def is_ordered_subsequence(applied: list, changes: list) -> bool:
    position = 0
    for item in applied:
        while position < len(changes) and changes[position] != item:
            position += 1
        if position == len(changes):
            return False
        position += 1
    return True


def test_postgres_replica_equals_the_source_exactly_once(pipeline, pg_server, unique_name):
    target_db = unique_name("replica")
    pg_server.create_database(target_db)
    target = pg_server.dsn(target_db)
    try:
        pipeline.sinks = {
            "replica": {
                "kind": "postgres",
                "from": f"{pipeline.name}.public.*",
                "batch_size": 90,
                "options": {"dsn": target, "schema": "public"},
            }
        }
        pipeline.setup(extra_tables=ITEMS_SCHEMA, tables=("public.t", "public.items"))
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(REPLICA_AUDIT)
        source = psycopg.connect(pipeline.dsn, autocommit=True)
        workload = Workload(source, seed=33)
        pipeline.cli("run", "--until-caught-up")  # empty snapshot; replicas created on first events
        pipeline.batches(0, 8)
        with source.transaction():
            for _ in range(40):
                workload.insert(workload.new_key())
        workload.transactions(30)
        pipeline.cli("run", "--until-caught-up")
        with psycopg.connect(target, autocommit=True) as conn:  # audit what the sink applies from now on
            conn.execute(
                "CREATE TRIGGER applied AFTER INSERT OR UPDATE OR DELETE ON t "
                "FOR EACH ROW EXECUTE FUNCTION record_applied()"
            )
            before = dict(conn.execute("SELECT id, v FROM t").fetchall())
        start = len(audited_changes(pipeline.dsn))
        source.execute("ALTER TABLE t ADD COLUMN note text DEFAULT 'n'")
        pipeline.batches(8, 10)
        workload.transactions(25)
        workload.truncate()
        workload.transactions(20)
        pipeline.cli("run", "--until-caught-up")

        # items: every row and column equals the source
        assert replica_rows(target) == source_rows(
            type("Db", (), {"execute": lambda self, q: source.execute(q).fetchall()})()
        )
        with psycopg.connect(target, autocommit=True) as conn:
            replica_t = dict(conn.execute("SELECT id, v FROM t").fetchall())
            notes = conn.execute("SELECT count(*) FROM t WHERE note = 'n'").fetchone()[0]
            applied = conn.execute("SELECT op, id, v FROM applied ORDER BY seq").fetchall()
            offsets = conn.execute(
                "SELECT count(*) FROM headwater_sink_offsets WHERE group_id = 'headwater.sink.replica'"
            ).fetchone()[0]
        assert replica_t == dict(source.execute("SELECT id, v FROM t").fetchall())
        assert notes == source.execute("SELECT count(*) FROM t WHERE note = 'n'").fetchone()[0] > 0
        assert offsets == 6  # 2 topics x 3 partitions, in the replica's own database
        # per key: what the sink applied is the source's changes in order (folded within a batch)
        truth: dict[int, list] = {}
        for op, row_id, v in audited_changes(pipeline.dsn)[start:]:
            truth.setdefault(row_id, []).append((op, v))
        got: dict[int, list] = {}
        for op, row_id, v in applied:
            got.setdefault(row_id, []).append(("d" if op == "d" else "w", v))
        for key, changes in truth.items():
            shape = [("d" if op == "d" else "w", v) for op, v in changes]
            assert is_ordered_subsequence(got.get(key, []), shape), (key, got.get(key), shape)
            final = None if changes[-1][0] == "d" else changes[-1][1]
            assert replica_t.get(key) == final
        assert set(got) <= set(truth) | set(before)
        source.close()
    finally:
        pg_server.drop_database(target_db)
