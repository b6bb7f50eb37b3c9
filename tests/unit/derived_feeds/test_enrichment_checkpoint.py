"""The enrichment state's checkpoint check (no Spark)."""

from __future__ import annotations

import pytest
import yaml

from derived_feeds.enrichment_state import EnrichmentStateError, check_checkpoint
from derived_feeds.feed_spec import feed_spec
from headwater.config import load_config
from headwater.errors import PermanentError


def enriched_spec(tmp_path):
    feed = {"from": "s.public.orders", "lookups": {"customers": "s.public.customers"}, "sql": "SELECT 1", "key": ["id"]}
    path = tmp_path / "headwater.yaml"
    path.write_text(yaml.safe_dump({"project": "t", "home": str(tmp_path / "home"), "feeds": {"enriched": feed}}))
    return feed_spec(load_config(path), "enriched")


def test_a_fresh_or_state_store_checkpoint_passes(tmp_path):
    spec = enriched_spec(tmp_path)
    check_checkpoint(spec)
    (spec.checkpoint / "spark" / "state" / "0" / "0").mkdir(parents=True)
    check_checkpoint(spec)


def test_a_parquet_state_checkpoint_is_refused_with_what_to_do(tmp_path):
    spec = enriched_spec(tmp_path)
    (spec.state_dir / "3").mkdir(parents=True)
    with pytest.raises(EnrichmentStateError) as raised:
        check_checkpoint(spec)
    message = str(raised.value)
    assert isinstance(raised.value, PermanentError)
    assert "\n" not in message
    assert "headwater reprocess enriched" in message
