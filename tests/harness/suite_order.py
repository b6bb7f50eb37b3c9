"""The order pytest-xdist hands test modules to workers: the longest first.

``make test`` runs ``pytest -n N --dist loadfile``: each module is one unit of work, run
whole on one worker (its module fixtures are set up once), and a worker that finishes takes
the next module of the queue. Which module runs last decides the wall time, so the queue
starts with the modules that took longest (``tests/module_times.json``, seconds per module
of a recorded run) and ends with the short ones, which fill the gaps. A module missing from
the file (a new one) counts as :data:`UNKNOWN_INTEGRATION_S` or :data:`UNKNOWN_UNIT_S`.

Refresh the file after a full run: ``pytest ... --module-times-out tests/module_times.json``
writes each module's setup+call+teardown seconds.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

TIMES_FILE = Path(__file__).parents[1] / "module_times.json"
#: Guesses for a module never measured: a new integration module starts services, so it goes early.
UNKNOWN_INTEGRATION_S = 60.0
UNKNOWN_UNIT_S = 5.0


def module_of(nodeid: str) -> str:
    """``tests/x/test_y.py::test_z[p]`` -> ``tests/x/test_y.py``."""
    return nodeid.split("::", 1)[0]


def load_times(path: Path = TIMES_FILE) -> dict[str, float]:
    """Recorded seconds per module; empty when the file is missing."""
    if not path.exists():
        return {}
    return {str(name): float(seconds) for name, seconds in json.loads(path.read_text()).items()}


def longest_first(items: list[Any], times: dict[str, float]) -> None:
    """Reorder ``items`` in place: modules by recorded seconds, longest first; tests keep their order inside."""

    def weight(module: str) -> float:
        if module in times:
            return times[module]
        return UNKNOWN_INTEGRATION_S if "/integration/" in f"/{module}" else UNKNOWN_UNIT_S

    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(module_of(item.nodeid), index)
    items.sort(key=lambda item: (-weight(module_of(item.nodeid)), first_seen[module_of(item.nodeid)]))


class ModuleTimes:
    """Adds up each module's setup, call and teardown seconds from the test reports (the controller's view)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: Any) -> None:
        self.seconds[module_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        ordered = dict(sorted(((m, round(s, 1)) for m, s in self.seconds.items()), key=lambda kv: -kv[1]))
        self.out.write_text(json.dumps(ordered, indent=1) + "\n")
