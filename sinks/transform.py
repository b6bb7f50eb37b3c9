"""A sink's ``transform:``: which fields of an event it delivers, as the envelope or flattened to the row.

* ``fields``: only these row columns are kept, in ``before`` and ``after`` (or in the flat row);
  a name no topic of the sink has is refused when the sink starts (:func:`unknown_fields`).
* ``flatten``: the row instead of the envelope, as Debezium's ExtractNewRecordState
  (``delete.handling.mode=rewrite``, ``add.fields=op,topic,source.ts_ms``): ``after``, or a
  delete's ``before``, plus ``__op``, ``__topic``, ``__deleted`` (true for deletes) and
  ``__source_ts_ms``. A truncate is ``{"__op": "t", ...}``, a logical message carries
  ``__message``.

Without a transform the event is delivered byte for byte as the log holds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from core.sink_config import TransformConfig

_DELETE = "d"


class Transform:
    """Turns an event (Debezium JSON) into what the sink delivers."""

    def __init__(self, config: TransformConfig) -> None:
        self.flatten = config.flatten
        self.fields = config.fields

    @property
    def identity(self) -> bool:
        """True when events pass unchanged (no decoding needed)."""
        return not self.flatten and self.fields is None

    def row(self, image: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """A row image narrowed to ``fields`` (``None`` stays ``None``)."""
        if image is None:
            return None
        if self.fields is None:
            return dict(image)
        return {name: image[name] for name in self.fields if name in image}

    def apply(self, topic: str, event: Mapping[str, Any]) -> dict[str, Any]:
        """The delivered form of ``event`` read from ``topic``."""
        op = event.get("op")
        if not self.flatten:
            out = dict(event)
            for side in ("before", "after"):
                if side in out:
                    out[side] = self.row(out[side])
            return out
        image = event.get("before") if op == _DELETE else event.get("after")
        flat = self.row(image) or {}
        flat["__op"] = op
        flat["__topic"] = topic
        flat["__deleted"] = op == _DELETE
        flat["__source_ts_ms"] = (event.get("source") or {}).get("ts_ms")
        if "message" in event:
            flat["__message"] = event["message"]
        return flat

    def payload(self, topic: str, value: bytes) -> bytes:
        """The delivered bytes of a stored event."""
        if self.identity:
            return value
        return orjson.dumps(self.apply(topic, orjson.loads(value)))


def unknown_fields(fields: Iterable[str], columns_by_topic: Mapping[str, Iterable[str]]) -> list[str]:
    """The names in ``fields`` that no topic's columns hold (a typo would otherwise deliver rows without them)."""
    known = {name for columns in columns_by_topic.values() for name in columns}
    return [name for name in fields if name not in known]
