"""The ``run --follow`` supervisor against real child processes (tiny Python programs)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from core.errors import EXIT_PERMANENT
from operations.pipeline import Stage, Supervisor


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_crashed_stage_is_restarted_and_a_permanent_failure_is_not(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    crashing = Stage("crashing", python(f"open({str(starts)!r}, 'a').write('x'); raise SystemExit(1)"))
    permanent = Stage("permanent", python(f"raise SystemExit({EXIT_PERMANENT})"))
    said: list[str] = []
    supervisor = Supervisor([crashing, permanent], said.append, poll_s=0.05)
    timer = threading.Timer(3.5, supervisor.stop)
    timer.start()
    try:
        status = supervisor.run()
    finally:
        timer.cancel()
    assert len(starts.read_text()) >= 2, said  # restarted after its crash (backoff 1 s)
    assert sum("started permanent" in line for line in said) == 1, said
    assert any("permanent stopped with an error that needs an operator" in line for line in said), said
    assert status == 1  # a stage that needs an operator makes the run fail


def test_the_supervisor_ends_when_every_stage_needs_an_operator() -> None:
    stages = [Stage(name, python(f"raise SystemExit({EXIT_PERMANENT})")) for name in ("capture", "load")]
    said: list[str] = []
    assert Supervisor(stages, said.append, poll_s=0.05).run() == 1  # returns without stop()
