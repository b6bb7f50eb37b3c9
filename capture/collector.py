"""The garbage collector's pace while an agent captures.

Each change allocates a few short-lived objects while a batch of records lives until its append;
collecting the young generation less often takes ~25% off the CPU per change (PostgreSQL), ~20%
(MySQL, bench/RESULTS.md). Only the young generation's threshold moves; the older ones keep theirs.
"""

from __future__ import annotations

import gc

#: Allocations between young-generation collections while capturing (CPython's default is 700).
YOUNG_THRESHOLD = 10_000


def space_young_collections() -> tuple[int, int, int]:
    """Collect the young generation every ``YOUNG_THRESHOLD`` allocations at most often; the thresholds to restore."""
    collector = gc.get_threshold()
    gc.set_threshold(max(collector[0], YOUNG_THRESHOLD), *collector[1:])
    return collector


def restore_collections(collector: tuple[int, int, int]) -> None:
    """Put back the thresholds :func:`space_young_collections` returned."""
    gc.set_threshold(*collector)
