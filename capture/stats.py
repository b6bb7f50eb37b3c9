"""What one capture agent has done so far (for progress display and tests)."""

from __future__ import annotations

from dataclasses import dataclass

from log.position import Position


@dataclass
class CaptureStats:
    """Counters of one agent's run; ``acked`` is the last position acknowledged to the source (its kind's)."""

    acked: Position
    transactions: int = 0
    events: int = 0
    records_written: int = 0
    records_skipped: int = 0
    reconnects: int = 0
