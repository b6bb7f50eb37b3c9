"""Members of a group opening a new SQLite offset store at the same moment all get it (real processes, one file)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

from log.offset_store import SqliteOffsetStore

PROCESSES, ROUNDS = 8, 20


def _open(path: str, barrier: Any, answers: Any) -> None:
    barrier.wait()
    try:
        SqliteOffsetStore(path).connection.close()
        answers.put("ok")
    except Exception as exc:  # reported by the test
        answers.put(repr(exc))


def test_processes_opening_a_new_store_together_all_open_it(tmp_path: Path) -> None:
    """SQLite refused the switch to WAL at once ("database is locked") in 2 of 30 such rounds before."""
    context = multiprocessing.get_context("fork")
    failures = []
    for round_ in range(ROUNDS):
        barrier, answers = context.Barrier(PROCESSES), context.Queue()
        path = str(tmp_path / f"offsets_{round_}.db")
        processes = [context.Process(target=_open, args=(path, barrier, answers)) for _ in range(PROCESSES)]
        for process in processes:
            process.start()
        failures += [answer for answer in (answers.get(timeout=60) for _ in processes) if answer != "ok"]
        for process in processes:
            process.join(timeout=60)
    assert not failures, failures
