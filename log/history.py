"""Whether the log still holds every version a full-history rebuild needs (SCD2 reprocess, daily backfill).

Compaction keeps only the latest record per key before a partition's clean offset, and
retention deletes whole old segments; a rebuild of history from such a range would
silently miss versions. One check serves every rebuild: it refuses in one line naming
the partition and its clean offset, unless the caller accepts incomplete history.
"""

from __future__ import annotations

from collections.abc import Mapping

from log.base import Log
from log.errors import IncompleteHistoryError


def require_full_history(log: Log, topic: str, starts: Mapping[int, int], *, what: str, remedy: str) -> None:
    """Raise :class:`IncompleteHistoryError` if a partition's clean offset lies after the offset ``what`` starts at.

    ``starts``: partition → the first offset the rebuild reads; ``remedy`` says what to do instead.
    """
    for partition, start in sorted(starts.items()):
        clean = log.clean_offset(topic, partition)
        if start < clean:
            raise IncompleteHistoryError(topic, partition, clean, start, what=what, remedy=remedy)
