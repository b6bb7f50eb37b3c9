"""The whole pipeline once, quickly: the smoke test of ``make test-fast``.

A source table is snapshotted and streamed (inserts, updates, a delete) by one ``headwater run
--until-caught-up`` (capture, a feed, an SCD1 table from the feed and an SCD2 table from the
raw topic, in one Spark session), and ``headwater query`` shows the warehouse equal to the
source (``harness.smoke``). Every deeper property (exactness under faults, types, schema changes) has its own
module; this one only shows, in about a minute, that the stages still fit together.
"""

from __future__ import annotations

from harness.smoke import run_pipeline_once


def test_run_carries_changes_through_a_feed_into_scd1_and_scd2(pg_database, unique_name, tmp_path):
    run_pipeline_once(pg_database, unique_name("smoke"), tmp_path)
