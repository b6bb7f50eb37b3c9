"""What a killed streaming query leaves in its checkpoint that would stop the next start.

Spark writes each offset and commit log entry to a hidden temporary file
(``offsets/.0.<uuid>.tmp`` and its ``..0.<uuid>.tmp.crc``) and renames it into place. A
process killed between the two leaves the temporary file behind. Once the query has a
first batch that does not matter (hidden files are not log entries), but before it, Spark 4
refuses to start: ``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY ... offsets should be empty
on batch 0`` (seen when a load was SIGKILLed during its first start), and every restart fails
the same way. Such files are removed before a query starts, and only then: the job's holder
lease (``operations.holders``) is taken before Spark starts, so no live writer owns them.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["drop_first_batch_leftovers"]

_LOGS = ("offsets", "commits")


def drop_first_batch_leftovers(root: Path) -> list[Path]:
    """Remove abandoned temporary log files of a query that never wrote its first offset entry.

    ``root`` is the query's checkpoint directory (checkpoints are always local paths here).
    Returns the files removed; a checkpoint with any offset entry is untouched.
    """
    if not root.is_dir():
        return []
    offsets = root / "offsets"
    if offsets.is_dir() and any(not entry.name.startswith(".") for entry in offsets.iterdir()):
        return []
    removed = []
    for log in _LOGS:
        directory = root / log
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():
            if entry.name.startswith(".") and entry.name.endswith((".tmp", ".tmp.crc")) and entry.is_file():
                entry.unlink(missing_ok=True)
                removed.append(entry)
    return removed
