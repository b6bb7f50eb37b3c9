"""Peak memory of one Delta compaction of a large table: Headwater's streamed rewrite against delta-rs's.

A table of ``--rows`` rows (``id``, ``v``, a ~400-byte ``pad``) in ``--files`` files is compacted
into one file, once by Headwater's compaction (:meth:`DeltaMaintainer._rewrite`, what the
maintenance stage and the loader run on a local table) and once by delta-rs's
``optimize.compact`` (the reference, what Headwater runs on object stores), each in a fresh
process on its own copy of the same table. Each prints its peak RSS (``ru_maxrss``), the RSS
before the compaction, wall and CPU seconds, and the bytes written.

    .venv/bin/python bench/compaction_memory_bench.py [--rows 4000000] [--files 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def build(directory: Path, rows: int, files: int) -> None:
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake

    for part in range(files):
        ids = np.arange(part * rows // files, (part + 1) * rows // files)
        pad = pa.array([(f"x{i:07d}") * 50 for i in ids])
        write_deltalake(str(directory), pa.table({"id": ids, "v": ids % 97, "pad": pad}), mode="append")


def high_water_mib() -> float:
    """This process's peak RSS (``VmHWM``: unlike ``ru_maxrss`` it does not carry the parent's over exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def compact(engine: str, directory: Path) -> dict[str, float]:
    """Run in a child process: compact the table at ``directory`` with ``engine``, report the numbers."""
    sys.path.insert(0, str(REPO))
    import pyarrow as pa
    from deltalake import DeltaTable

    from warehouse_loader.delta.maintenance import DeltaMaintainer
    from warehouse_loader.location import TableLocation

    table = DeltaTable(str(directory))
    before = high_water_mib()
    wall, cpu = time.monotonic(), time.process_time()
    if engine == "headwater":
        paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
        _, _, written = DeltaMaintainer(TableLocation(str(directory)))._rewrite(table, [paths], None)
    else:
        metrics = table.optimize.compact(target_size=1 << 40)
        written = json.loads(metrics.get("filesAdded", "{}")).get("totalSize", 0)
    return {
        "peak_mib": high_water_mib(),
        "before_mib": before,
        "wall_s": time.monotonic() - wall,
        "cpu_s": time.process_time() - cpu,
        "written_mb": written / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--table", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        print(json.dumps(compact(args.engine, Path(args.table))))
        return
    root = Path(tempfile.mkdtemp(prefix="hw-compaction-bench-"))
    try:
        build(root / "source", args.rows, args.files)
        print(f"table: {args.rows:,} rows in {args.files} files, load {os.getloadavg()[0]:.1f}")
        for engine in ("headwater", "delta-rs"):
            copy = root / engine
            shutil.copytree(root / "source", copy)
            child = [sys.executable, __file__, "--engine", engine, "--table", str(copy)]
            result = subprocess.run(child, check=True, capture_output=True, text=True)
            numbers = json.loads(result.stdout.strip().splitlines()[-1])
            print(
                f"{engine}: peak RSS {numbers['peak_mib']:,.0f} MiB (before {numbers['before_mib']:,.0f}), "
                f"{numbers['wall_s']:.2f} s wall, {numbers['cpu_s']:.2f} s CPU, wrote {numbers['written_mb']:.1f} MB"
            )
            shutil.rmtree(copy)
        print(f"load after {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
