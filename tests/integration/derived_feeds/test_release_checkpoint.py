"""Maintained views drop their old local checkpoints each micro-batch instead of waiting for the JVM's GC."""

from __future__ import annotations

import pytest

from derived_feeds.maintained_view import release_checkpoint


def test_a_released_local_checkpoint_has_no_blocks_left(spark):
    frame = spark.range(1_000).localCheckpoint()
    assert frame.count() == 1_000
    release_checkpoint(frame)
    with pytest.raises(Exception, match="CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"):
        frame.count()


def test_a_frame_that_is_not_a_local_checkpoint_is_left_alone(spark):
    checkpointed = spark.range(1_000).localCheckpoint()
    derived = checkpointed.where("id % 2 = 0")
    release_checkpoint(derived)
    assert derived.count() == 500
    assert checkpointed.count() == 1_000
