"""Exponential backoff with jitter between attempts at a target that is down."""

from __future__ import annotations

import random


class Backoff:
    """Delays ``initial_s, 2 * initial_s, ...`` capped at ``max_s``, each jittered to between half and all of it.

    The jitter spreads the retries of many sinks (or many processes of one) after a shared
    outage; keeping half of the delay keeps the growth (full jitter could retry at once).
    """

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.initial_s = initial_s
        self.max_s = max(max_s, initial_s)
        self.attempts = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        """The delay before the next attempt (grows with each call until :meth:`reset`)."""
        ceiling = min(self.max_s, self.initial_s * 2 ** min(self.attempts, 62))
        self.attempts += 1
        return float(ceiling / 2 + self._rng.uniform(0, ceiling / 2))

    def reset(self) -> None:
        """The target answered: start from ``initial_s`` again."""
        self.attempts = 0
