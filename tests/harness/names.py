"""Names unique per test run and per test, safe as Postgres identifiers and Kafka topic names."""

from __future__ import annotations

import hashlib
import itertools
import re
import uuid

# Unique per pytest process, so reruns against a long-lived server never collide.
RUN_ID = uuid.uuid4().hex[:6]
_counter = itertools.count()
_POSTGRES_MAX_IDENTIFIER = 63


class NameFactory:
    """``factory("slot")`` -> ``slot_<run>_<test hash>_<n>``: lower-case ``[a-z0-9_]``, at most 63 chars.

    Valid unquoted as a Postgres database/role/slot/publication name and as a Kafka topic.
    """

    def __init__(self, test_id: str) -> None:
        self.test_hash = hashlib.sha1(test_id.encode()).hexdigest()[:6]

    def __call__(self, prefix: str = "hw") -> str:
        clean = re.sub(r"[^a-z0-9_]", "_", prefix.lower()) or "hw"
        if not clean[0].isalpha():
            clean = f"hw_{clean}"
        suffix = f"_{RUN_ID}_{self.test_hash}_{next(_counter)}"
        return clean[: _POSTGRES_MAX_IDENTIFIER - len(suffix)] + suffix
