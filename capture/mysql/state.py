"""Where MySQL capture resumes: the binlog position after the last transaction the log holds.

``<home>/capture/<source>/binlog.json``: ``{"file", "offset", "gtid", "commit_ts"}``, replaced
whole (``core.durable_files``) only after the appends of the transactions before it returned, so
it is at or before what the log holds. A restart reads the binlog from there, and records the log
already holds are skipped (:class:`capture.position.ResumePoint`): nothing is lost or doubled
whichever of the two a crash came between.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from capture.mysql.binlog.position import BinlogPosition, GtidPosition
from core.durable_files import replace_json

STATE_FILE = "binlog.json"
_NO_GTIDS = GtidPosition()


@dataclass(frozen=True)
class StreamState:
    """The resume position: a file position, and the GTID position (MariaDB) at the same point.

    ``commit_ts`` is the binlog timestamp (Unix seconds, the server's clock) of the last captured
    transaction before the position, when one was streamed (``status`` and ``/metrics`` lag).
    """

    position: BinlogPosition
    gtids: GtidPosition = _NO_GTIDS
    commit_ts: int | None = None

    def to_json(self) -> dict[str, object]:
        """The file's content."""
        data: dict[str, object] = {"file": self.position.file, "offset": self.position.offset, "gtid": str(self.gtids)}
        if self.commit_ts is not None:
            data["commit_ts"] = self.commit_ts
        return data

    @classmethod
    def from_json(cls, data: dict[str, object]) -> StreamState:
        """Inverse of :meth:`to_json`."""
        committed = data.get("commit_ts")
        return cls(
            BinlogPosition(str(data["file"]), int(str(data["offset"]))),
            GtidPosition.parse(str(data.get("gtid", ""))),
            None if committed is None else int(str(committed)),
        )


def load_state(directory: Path) -> StreamState | None:
    """The saved state, or None before the first save."""
    path = directory / STATE_FILE
    if not path.exists():
        return None
    return StreamState.from_json(json.loads(path.read_text()))


def save_state(directory: Path, state: StreamState) -> None:
    """Replace the saved state (durably)."""
    directory.mkdir(parents=True, exist_ok=True)
    replace_json(directory / STATE_FILE, state.to_json())
