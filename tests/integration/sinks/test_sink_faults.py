"""Sinks under the faults operators meet: the target killed and restarted mid-stream, the sink SIGKILLed.

For each kind, ``capture --follow`` and ``sinks run --follow`` run as real processes while
batches are written to the audited table ``t``:

1. the target is killed (SIGKILL; the webhook receiver stops listening) while changes go on:
   ``headwater status`` shows the sink ``blocked`` and ``/metrics`` ``headwater_sink_blocked 1``;
2. the target comes back: the sink goes on by itself;
3. the sink's process group is SIGKILLed mid-stream and started again.

Then every key's changes must have arrived in the source's order with nothing missing.
Repeats: none for Redis (exactly once: checkpoints in Redis), none for NATS (the restart is
within the duplicate window), any for RabbitMQ and webhooks (at least once; repeats carry their
ids). The PostgreSQL sink is checked through an audit trigger on the replica (exactly once: no
change applied twice), with a poison row refused by a constraint of the replica on the way.
"""

from __future__ import annotations

import contextlib
import time
import urllib.request

import orjson
import psycopg
import pytest
from harness.postgres import start_pg_server
from harness.sink_pipeline import check_delivery, final_rows, kill_group
from harness.sink_readers import nats_stream, rabbit_queue, redis_stream
from harness.sink_servers import WebhookReceiver

from operations.embedded_postgres import free_port


def wait_for(check, timeout_s: float = 150.0, every_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(every_s)


def sink_state(pipeline) -> dict:
    (row,) = orjson.loads(pipeline.cli("status", "--json").stdout)["sinks"]
    return row


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def run_faults(pipeline, kill_target, start_target, *, batches=(8, 6, 6)) -> None:
    """The scenario of the module docstring; returns once the last batch is written."""
    metrics_port = free_port("127.0.0.1")
    pipeline.cli("run", "--until-caught-up")  # empty snapshot
    pipeline.start("capture", "--follow")
    sink = pipeline.start("sinks", "run", "--follow", "--metrics-port", str(metrics_port))
    first, killed, after = batches
    pipeline.batches(0, first)
    kill_target()
    pipeline.batches(first, killed)

    def blocked() -> None:
        row = sink_state(pipeline)
        assert row["state"] == "blocked", row
        assert 'headwater_sink_blocked{sink="' in scrape(metrics_port)
        scraped = scrape(metrics_port).splitlines()
        gauge = next(line for line in scraped if line.startswith("headwater_sink_blocked{"))
        assert gauge.endswith(" 1.0"), gauge
        lag = next(line for line in scraped if line.startswith("headwater_lag_records{") and 'stage="sink"' in line)
        assert float(lag.rsplit(" ", 1)[1]) > 0, lag  # changes wait behind the blocked batch

    wait_for(blocked, 90)
    start_target()
    wait_for(lambda: _running(pipeline), 90)
    pipeline.batches(first + killed, after // 2)
    kill_group(sink)  # SIGKILL mid-stream
    pipeline.batches(first + killed + after // 2, after - after // 2)
    pipeline.start("sinks", "run", "--follow")


def _running(pipeline) -> None:
    assert sink_state(pipeline)["state"] == "running"


@pytest.mark.parametrize("kind", ["redis", "nats", "rabbitmq", "webhook"])
def test_target_killed_and_sink_sigkilled_lose_nothing(kind, pipeline, unique_name, request):
    name = unique_name(kind)
    receiver = None
    if kind == "redis":
        server = request.getfixturevalue("redis_server")
        options = {"url": server.url, "stream": name}
        read = lambda: redis_stream(server.client(), name)  # noqa: E731
        allowed_repeats = 0
    elif kind == "nats":
        server = request.getfixturevalue("nats_server")
        options = {"servers": server.url, "subject": f"{name}.{{table}}", "stream": name.upper(), "timeout_s": 3}
        read = lambda: nats_stream(server.url, name.upper())  # noqa: E731
        allowed_repeats = 0
    elif kind == "rabbitmq":
        server = request.getfixturevalue("rabbit_server")
        options = {"url": server.url, "exchange": name, "queue": name, "timeout_s": 5}
        got: list = []
        read = lambda: got.extend(rabbit_queue(server.url, name)) or list(got)  # noqa: E731
        allowed_repeats = None
    else:
        receiver = server = WebhookReceiver()
        options = {"url": receiver.url, "timeout_s": 3}
        read = lambda: [(e["id"], *_event(e["value"])) for e in receiver.elements()]  # noqa: E731
        allowed_repeats = None
    pipeline.sinks = {
        "out": {
            "kind": kind,
            "from": pipeline.topic,
            "batch_size": 40,
            "options": options,
            "retry": {"initial_s": 0.2, "max_s": 2},
        }
    }
    pipeline.setup()
    try:
        run_faults(pipeline, server.kill, server.start)

        def complete():
            delivered = read()
            report = check_delivery(pipeline.dsn, delivered)
            last = {}
            for _, row_id, op, v in delivered:
                last[row_id] = None if op == "d" else v
            assert {k: v for k, v in last.items() if v is not None} == final_rows(pipeline.dsn)
            # A kind that keeps its checkpoints in the target (Redis) copies them to the sink's group for
            # lag at most every second and when idle, so lag reaches 0 just after the last delivery, not
            # with it (ci69: the records were all in Redis and lag still read 385 at that instant).
            assert sink_state(pipeline)["lag"] == 0
            return report

        report = wait_for(complete, 180, 2)
        if allowed_repeats is not None:
            assert report.repeats == allowed_repeats, report
        print(f"{kind}: {report}")
    finally:
        pipeline.close()
        if receiver is not None:
            receiver.close()
        elif server.process is None:
            server.start()  # shared by the session: leave it running


def _event(value):
    from harness.sink_pipeline import event_of

    return event_of(value)


def test_postgres_target_killed_sink_sigkilled_and_a_poison_row(pipeline, unique_name):
    target, stop_target = start_pg_server()
    try:
        dsn = target.dsn("postgres")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, pad text, "
                "__hw_commit_lsn bigint, __hw_txn_index integer, CONSTRAINT no_13 CHECK (v <> 13))"
            )
            conn.execute(
                "CREATE TABLE applied (seq bigserial PRIMARY KEY, op text, id int, v int);"
                "CREATE FUNCTION record_applied() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF TG_OP = 'DELETE' THEN INSERT INTO applied (op, id, v) VALUES ('d', OLD.id, NULL); "
                "ELSE INSERT INTO applied (op, id, v) VALUES ('w', NEW.id, NEW.v); END IF; RETURN NULL; END $$;"
                "CREATE TRIGGER applied AFTER INSERT OR UPDATE OR DELETE ON t "
                "FOR EACH ROW EXECUTE FUNCTION record_applied()"
            )
        pipeline.sinks = {
            "replica": {
                "kind": "postgres",
                "from": pipeline.topic,
                "batch_size": 40,
                "options": {"dsn": dsn},
                "retry": {"initial_s": 0.2, "max_s": 2},
            }
        }
        pipeline.setup()
        run_faults(pipeline, lambda: target.stop("immediate"), target.start)
        # the row the replica refuses (v = 13) exists at the source: it is the one poison record

        def complete():
            with psycopg.connect(dsn, autocommit=True) as conn:
                replica = dict(conn.execute("SELECT id, v FROM t").fetchall())
            source = final_rows(pipeline.dsn)
            assert replica == {k: v for k, v in source.items() if v != 13}
            assert sink_state(pipeline)["lag"] == 0
            return replica

        wait_for(complete, 180, 2)
        with psycopg.connect(dsn, autocommit=True) as conn:
            applied = conn.execute("SELECT op, id, v FROM applied ORDER BY seq").fetchall()
        truth: dict[int, list] = {}
        with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
            for op, row_id, v in conn.execute("SELECT op, id, v FROM audit ORDER BY seq"):
                truth.setdefault(row_id, []).append(("d" if op == "d" else "w", v))
        per_key: dict[int, list] = {}
        for op, row_id, v in applied:
            per_key.setdefault(row_id, []).append((op, v))
        for key, changes in per_key.items():
            # exactly once and in order: what was applied is the source's changes in order, none twice
            position = 0
            for change in changes:
                while position < len(truth[key]) and truth[key][position] != change:
                    position += 1
                assert position < len(truth[key]), (key, changes, truth[key])
                position += 1
        row = sink_state(pipeline)
        refused = sum(1 for changes in truth.values() for op, v in changes if v == 13)
        # a change to v = 13 folded into a later change of its key within one batch is never tried
        assert 1 <= row["dead_lettered"] <= refused
    finally:
        pipeline.close()
        with contextlib.suppress(Exception):
            stop_target()
