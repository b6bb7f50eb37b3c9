"""Where the PostgreSQL sink's time goes beside psycopg's own COPY + upsert: CPU on each side, and waits.

The same records and reference as ``bench/sinks_bench.py`` (its ``fill`` and ``ref_postgres``),
alternating reference and sink ``--rounds`` times on one server. Per run it prints the wall time,
this process's CPU (the client, or the sink's threads), the server's CPU (every ``postgres``
process, exited backends included through the postmaster's reaped-children counters), and the
time spent in psycopg waiting for the server (``Connection.wait``), by generator. Run it quiet and
beside busy loops (``--busy 4``) to see which part grows with the load.

    .venv/bin/python bench/postgres_sink_probe.py [--records N] [--batch N] [--rounds N] [--busy N] [--inline]

``--inline`` delivers each batch on the reading thread (no read-ahead), to tell the two threads'
competition from the rest.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import psycopg  # noqa: E402
import sinks_bench as bench  # noqa: E402

import sinks.runner  # noqa: E402

WAITS: collections.Counter[str] = collections.Counter()
WAITED: collections.Counter[str] = collections.Counter()
_wait = psycopg.Connection.wait


def _timed_wait(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
    started = time.perf_counter()
    try:
        return _wait(self, gen, *args, **kwargs)
    finally:
        name = getattr(gen, "__qualname__", "?").removeprefix("Base")
        WAITS[name] += 1
        WAITED[name] += time.perf_counter() - started


def _server_cpu() -> float:
    """CPU seconds of every postgres process, exited backends included (the postmaster's reaped children)."""
    ticks = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if not stat[stat.index("(") + 1 : stat.rindex(")")].startswith("postgres"):
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks += int(fields[11]) + int(fields[12])
        try:
            parent = Path(f"/proc/{fields[1]}/stat").read_text()
        except OSError:
            parent = ""
        if "(postgres" not in parent:  # the postmaster: add what its exited backends used
            ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


class _Inline:
    """A ThreadPoolExecutor stand-in that runs each delivery on the calling thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the caller, as the executor would
            future.set_exception(exc)
        return future

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        pass


def _busy() -> None:
    while True:
        pass


def _measure(label: str, run: Any) -> str:
    WAITS.clear()
    WAITED.clear()
    cpu, server, started = time.process_time(), _server_cpu(), time.perf_counter()
    run()
    wall = time.perf_counter() - started
    cpu, server = time.process_time() - cpu, _server_cpu() - server
    waits = " ".join(f"{name} {WAITS[name]}x {WAITED[name]:.2f}s" for name in sorted(WAITS))
    waited = sum(WAITED.values())
    return (
        f"{label}: wall {wall:.2f} s, client CPU {cpu:.2f} s, server CPU {server:.2f} s, waits {waited:.2f} s ({waits})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, help="busy-loop processes beside the runs")
    parser.add_argument("--inline", action="store_true", help="deliver on the reading thread")
    args = parser.parse_args()
    psycopg.Connection.wait = _timed_wait  # type: ignore[method-assign]
    if args.inline:
        sinks.runner.ThreadPoolExecutor = _Inline  # type: ignore[misc,assignment]
    from harness.postgres import start_pg_server

    work = Path(tempfile.mkdtemp(prefix="hw-pg-sink-probe-"))
    home = work / "home"
    records = bench.fill(
        bench.parse_config({"project": "bench", "home": str(home)}, work / "headwater.yaml"), args.records
    )
    busy = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.busy)]
    for process in busy:
        process.start()
    pg, stop = start_pg_server()
    try:
        dsn = pg.dsn("postgres")
        for round_ in range(args.rounds):
            ref = _measure("reference", lambda: bench.ref_postgres(dsn, records, args.batch, f"ref_{round_}"))  # noqa: B023
            options = {"dsn": dsn, "schema": f"s_{round_}"}
            # a group of its own each round: it reads every record
            sink = _measure("sink", lambda: bench.run_sink(home, "postgres", options, args.batch, f"s_{round_}"))  # noqa: B023
            mode = ", inline" if args.inline else ""
            print(f"round {round_ + 1} (load {os.getloadavg()[0]:.1f}{mode})\n  {ref}\n  {sink}", flush=True)
    finally:
        stop()
        for process in busy:
            process.kill()


if __name__ == "__main__":
    main()
