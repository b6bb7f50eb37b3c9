"""The enrichment state's checkpoint check (no Spark)."""

from __future__ import annotations

import pytest
import yaml

from core.config import load_config
from core.errors import PermanentError
from derived_feeds.enrichment_state import EnrichmentStateError, check_checkpoint
from derived_feeds.feed_spec import feed_spec


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


def _state_schema(spec, value_fields: str) -> None:
    """A state schema file as Spark writes it (``v2`` header, key and value schema JSON)."""
    path = spec.checkpoint / "spark" / "state" / "0" / "1" / "_metadata" / "schema"
    path.parent.mkdir(parents=True)
    key = '{"type":"struct","fields":[{"name":"topic","type":"string","nullable":true,"metadata":{}}]}'
    value = '{"type":"struct","fields":[{"name":"latest","type":{"type":"struct","fields":[' + value_fields
    path.write_bytes(b"\x00v2\x00\x00\x00\x5f" + key.encode() + b"\x00\x00\x01\x00" + value.encode())


def test_a_state_with_typed_images_is_refused_with_what_to_do(tmp_path):
    spec = enriched_spec(tmp_path)
    _state_schema(spec, '{"name":"op","type":"string"},{"name":"__hw_image","type":{"type":"struct","fields":[]}}')
    with pytest.raises(EnrichmentStateError) as raised:
        check_checkpoint(spec)
    message = str(raised.value)
    assert "\n" not in message
    assert "typed row images" in message
    assert "headwater reprocess enriched" in message


def test_a_state_with_json_images_passes(tmp_path):
    spec = enriched_spec(tmp_path)
    _state_schema(spec, '{"name":"op","type":"string"},{"name":"__hw_image_json","type":"string"}')
    check_checkpoint(spec)
