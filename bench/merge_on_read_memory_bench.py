"""Peak memory of merge-on-read SCD1 batches into one Delta table, with and without the loader's compaction.

Replays what ``headwater load`` does per micro-batch, without Spark: a table of ``--keys``
rows (``pad`` of 400 bytes), then ``--batches`` batches of ``--batch`` random updates, each
written by :func:`warehouse_loader.delta.writer.write_batch` merge-on-read, as the loader's
``foreachBatch`` does. With ``--loader-compaction on`` (what the loader does since issue 31)
:class:`warehouse_loader.maintenance.BuriedRows` runs after each batch with the default
maintenance settings; ``off`` is the loader before it (no maintenance stage beside it).

RSS of this process is sampled every 10 ms; per batch it prints the wall time, the RSS
before, and the peak RSS with the phase it happened in (``merge``: the DuckDB joins of
:func:`warehouse_loader.delta.merge_on_read.merge`; ``_file_actions``: the deletion vectors
written; ``compact``: the loader's compaction).

    .venv/bin/python bench/merge_on_read_memory_bench.py [--keys 1000000] [--batch 200000]
        [--batches 30] [--loader-compaction on|off]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from harness.auto_cdc_examples import seq  # noqa: E402

from core.warehouse_config import MaintenanceConfig, TableConfig  # noqa: E402
from warehouse_loader.changes import COMMIT_TS, OP, SEQ  # noqa: E402
from warehouse_loader.delta import merge_on_read as mor  # noqa: E402
from warehouse_loader.delta.maintenance import DeltaMaintainer  # noqa: E402
from warehouse_loader.delta.writer import write_batch  # noqa: E402
from warehouse_loader.location import TableLocation  # noqa: E402
from warehouse_loader.maintenance import BuriedRows  # noqa: E402

SCD1 = TableConfig.model_validate({"from": "t", "mode": "scd1"})
PAD = "x" * 400


def rss_mib() -> int:
    with open("/proc/self/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0]) // 1024


class Peaks:
    """The peak RSS per phase, sampled by a thread."""

    def __init__(self) -> None:
        self.phase = "idle"
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            rss, phase = rss_mib(), self.phase
            if rss > self.peaks.get(phase, 0):
                self.peaks[phase] = rss

    def wrap(self, module: Any, name: str) -> None:
        original = getattr(module, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            before, self.phase = self.phase, name
            try:
                return original(*args, **kwargs)
            finally:
                self.phase = before

        setattr(module, name, wrapped)

    def top(self) -> tuple[str, int]:
        phase = max(self.peaks, key=lambda p: self.peaks[p])
        return phase, self.peaks[phase]


def changes(keys: np.ndarray, first: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(keys, pa.int64()),
            "pad": pa.array([PAD] * len(keys)),
            SEQ: pa.array([seq(first + i) for i in range(len(keys))], pa.string()),
            OP: pa.array(["u"] * len(keys)),
            COMMIT_TS: pa.array(np.full(len(keys), 1_700_000_000_000_000), pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--loader-compaction", choices=("on", "off"), default="on")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hw-mor-memory-"))
    path = TableLocation(str(work / "t"))
    peaks = Peaks()
    for name in ("merge", "_file_actions"):
        peaks.wrap(mor, name)
    buried = BuriedRows(DeltaMaintainer(path), MaintenanceConfig()) if args.loader_compaction == "on" else None
    rng = np.random.default_rng(7)
    written = 0
    worst: list[int] = []
    try:
        for k in range(args.batches + 1):
            keys = np.arange(args.keys) if k == 0 else np.unique(rng.integers(0, args.keys, args.batch))
            batch = changes(keys, written + 1)
            written += len(keys)
            peaks.peaks.clear()
            base, started = rss_mib(), time.monotonic()
            write_batch(path, batch, table="t", batch_id=k, keys=["id"], config=SCD1, merge_on_read=True)
            del batch
            compacted = None
            if buried is not None:
                peaks.phase = "compact"
                compacted = buried.after_commit(len(keys))
                peaks.phase = "idle"
            phase, peak = peaks.top()
            if k:
                worst.append(peak)
            print(
                f"batch {k}: {len(keys):,} keys, {time.monotonic() - started:.1f} s, RSS before {base} MiB, "
                f"peak {peak} MiB in {phase}"
                + (f", compacted {compacted[0]} files into {compacted[1]}" if compacted else ""),
                flush=True,
            )
        print(
            f"merge_on_read_memory_bench (loader compaction {args.loader_compaction}): peak over batches 1-5 "
            f"{max(worst[:5])} MiB, over the last 5 {max(worst[-5:])} MiB"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
