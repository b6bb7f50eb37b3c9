"""The webhook sink end to end: Postgres -> capture -> log -> sink -> a real HTTP receiver.

Every key's changes arrive in the source's order (repeats removed by id), nothing is missing,
each request is signed; a refused (4xx) record goes to the dead-letter topic and the rest goes on.
"""

from __future__ import annotations

import orjson
from harness.sink_pipeline import check_delivery, event_of, final_rows
from harness.sink_servers import WebhookReceiver

from core.config import load_config
from log.factory import open_log
from log.topics import dead_letter_topic


def delivered(receiver: WebhookReceiver) -> list[tuple[str, int, str, int | None]]:
    return [(e["id"], *event_of(e["value"])) for e in receiver.elements()]


def test_webhook_delivers_every_change_in_key_order_signed(pipeline):
    receiver = WebhookReceiver(secret=b"s3cret")
    try:
        pipeline.sinks = {
            "hook": {
                "kind": "webhook",
                "from": [f"{pipeline.name}.public.*"],
                "batch_size": 37,
                "options": {"url": receiver.url, "secret": "s3cret"},
            }
        }
        pipeline.setup()
        pipeline.cli("run", "--until-caught-up")
        pipeline.batches(0, 12)
        pipeline.cli("run", "--until-caught-up")
        pipeline.batches(12, 8)
        pipeline.cli("capture", "--until-caught-up")
        result = pipeline.cli("sinks", "run", "--until-caught-up")
        assert "hook:" in result.stdout
        report = check_delivery(pipeline.dsn, delivered(receiver))
        assert report.repeats == 0
        assert receiver.bad_signatures == 0
        last = {}
        for _, row_id, op, v in delivered(receiver):
            last[row_id] = None if op == "d" else v
        assert {k: v for k, v in last.items() if v is not None} == final_rows(pipeline.dsn)
    finally:
        receiver.close()


def test_a_refused_record_goes_to_the_dead_letter_topic_and_the_rest_goes_on(pipeline):
    receiver = WebhookReceiver()
    try:
        pipeline.sinks = {
            "hook": {"kind": "webhook", "from": pipeline.topic, "batch_size": 50, "options": {"url": receiver.url}}
        }
        pipeline.setup()
        pipeline.cli("run", "--until-caught-up")
        pipeline.batches(0, 5)
        pipeline.cli("capture", "--until-caught-up")
        config = load_config(pipeline.config)
        log = open_log(config)
        try:
            poison = next(r for r in log.read(pipeline.topic, 1, 0, max_records=100) if r.value is not None)
        finally:
            log.close()
        poison_id = f"{poison.topic}/{poison.partition}/{poison.offset}"
        receiver.refuse.add(poison_id)
        pipeline.cli("sinks", "run", "hook", "--until-caught-up")
        ids = [e["id"] for e in receiver.elements()]
        assert poison_id not in ids
        log = open_log(config)
        try:
            dead = log.read(dead_letter_topic("hook"), 0, 0) + log.read(dead_letter_topic("hook"), 1, 0)
            dead += log.read(dead_letter_topic("hook"), 2, 0)
        finally:
            log.close()
        assert len(dead) == 1
        headers = dict(dead[0].headers)
        assert headers["headwater.offset"] == str(poison.offset).encode()
        assert b"422" in headers["headwater.error"]
        assert orjson.loads(dead[0].value) == orjson.loads(poison.value)
        # everything else arrived, once
        assert len(ids) == len(set(ids))
        receiver.refuse.clear()
        status = orjson.loads(pipeline.cli("status", "--json").stdout)
        (row,) = status["sinks"]
        assert row["dead_lettered"] == 1 and row["lag"] == 0
    finally:
        receiver.close()


def test_replay_delivers_again_from_an_offset_or_a_time_and_refuses_while_running(pipeline):
    receiver = WebhookReceiver()
    try:
        pipeline.sinks = {"hook": {"kind": "webhook", "from": pipeline.topic, "options": {"url": receiver.url}}}
        pipeline.setup()
        pipeline.cli("run", "--until-caught-up")
        pipeline.batches(0, 3)
        pipeline.cli("run", "--until-caught-up")
        first = [e["id"] for e in receiver.elements()]
        assert first and len(first) == len(set(first))
        midpoint = max(e["timestamp_ms"] for e in receiver.elements()) + 1
        import datetime as dt

        later = dt.datetime.fromtimestamp(midpoint / 1000, dt.UTC).isoformat()
        pipeline.batches(3, 2)
        pipeline.cli("run", "--until-caught-up")
        second = [e["id"] for e in receiver.elements()][len(first) :]
        # from a time: what came after it, again
        replayed = pipeline.cli("sinks", "replay", "hook", "--from", later, "--json")
        assert len(orjson.loads(replayed.stdout)) == 3  # every partition of the topic
        pipeline.cli("sinks", "run", "--until-caught-up")
        assert sorted([e["id"] for e in receiver.elements()][len(first) + len(second) :]) == sorted(second)
        # from offset 0: everything again, with the same ids
        pipeline.cli("sinks", "replay", "hook", "--from", "0")
        pipeline.cli("sinks", "run", "--until-caught-up")
        again = [e["id"] for e in receiver.elements()][len(first) + 2 * len(second) :]
        assert sorted(again) == sorted(first + second)
        # a running sink is not moved under its feet
        running = pipeline.start("sinks", "run", "--follow")
        import time

        deadline = time.monotonic() + 60
        while True:
            refused = pipeline.cli("sinks", "replay", "hook", "--from", "0", check=False)
            if refused.returncode != 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert refused.returncode == 3
        assert refused.stderr.startswith("error: sink hook: is running (1 member(s) in group headwater.sink.hook)")
        assert len(refused.stderr.strip().splitlines()) == 1
        running.terminate()
        assert running.wait(30) == 0
        bad = pipeline.cli("sinks", "replay", "hook", "--from", "yesterday", check=False)
        assert bad.returncode == 2 and "neither an offset nor an ISO 8601 time" in bad.stderr
    finally:
        receiver.close()
