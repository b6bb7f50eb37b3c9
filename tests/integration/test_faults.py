"""Fault injection under load (issue 9): seeded SIGKILLs of every pipeline process, then exactness.

A steady seeded workload runs against two tables (``items``: composite key, TOASTed
column, key changes, deletes; ``accounts``: a feed with a ``drop`` and a ``warn``
expectation). After the snapshot (``headwater capture --until-caught-up``) the real CLI
processes (``headwater capture --follow``, ``feeds run --follow``, ``load --follow``) are
SIGKILLed at seeded random moments and restarted at once (``harness.fault_injection``),
on the file backend and on the Kafka backend (tansu); with broker kills too where tansu
can keep its log on persistent storage (see ``harness.broker``). Afterwards ``headwater
run --until-caught-up`` and:

* every committed change is in the log exactly once: the streamed events of each
  transaction equal what an audit trigger in Postgres recorded for it (table, op, key),
  and no ``(commit_lsn, txn_index)`` occurs twice;
* every warehouse table (SCD1 from a raw topic, SCD2 current rows, SCD1 from the feed)
  equals its source in Postgres by a checksum over every column;
* the quarantine holds only rows that fail the ``drop`` expectation, and for every row
  whose current value fails it, the latest quarantined image is that value.

The scenario itself is ``harness.fault_scenario``; the broker-kill scenario is in
``test_faults_broker.py``, so pytest-xdist runs the two long scenarios on different workers.

``HEADWATER_FAULT_SEED`` picks the seed (printed in every assertion message); the kill
schedule of each component depends only on it. Each test prints a ``faults:`` summary
line (run with ``-s`` to see it).
"""

from __future__ import annotations

import pytest
from harness.fault_scenario import fault_scenario

#: Each scenario is bounded: snapshot, <= FAULT_PHASE_S of kills, final run; ~4 min on an
#: idle 2-core machine, up to ~10 min when parallel suites load it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_sigkills_under_load_lose_nothing_and_apply_nothing_twice(pg_database, unique_name, tmp_path):
    """The file backend: capture, feed and load processes killed (20 kills)."""
    summary = fault_scenario(pg_database, tmp_path, unique_name("flt"), "file", {"partitions": 3}, [])
    print(f"\nfaults: {summary}")


def test_sigkills_on_the_kafka_backend_with_an_in_memory_broker(kafka_broker, pg_database, unique_name, tmp_path):
    """The Kafka backend without broker kills (the session's in-memory tansu); the broker kills on
    S3-backed tansu are opt-in (``test_faults_broker.py``, ``HEADWATER_FAULTS_BROKER=1``)."""
    log_settings = {"partitions": 3, "backend": "kafka", "kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers}}
    summary = fault_scenario(pg_database, tmp_path, unique_name("flt"), "kafka", log_settings, [])
    print(f"\nfaults: {summary}")
