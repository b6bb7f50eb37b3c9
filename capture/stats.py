"""What one capture agent has done so far (for progress display and tests)."""

from __future__ import annotations

from dataclasses import dataclass, field

from log.sequence import Lsn


@dataclass
class CaptureStats:
    """Counters of one agent's run; ``acked_lsn`` is the last LSN acknowledged to Postgres."""

    transactions: int = 0
    events: int = 0
    records_written: int = 0
    records_skipped: int = 0
    acked_lsn: Lsn = field(default_factory=lambda: Lsn(0))
    reconnects: int = 0
