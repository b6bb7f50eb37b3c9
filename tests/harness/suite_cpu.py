"""Where the suite's CPU goes: seconds of CPU per test module and per kind of process.

The suite is CPU-bound on two cores (load 5-15 for most of a run), so only less CPU per test
shortens it; wall seconds per module (``module_times.json``) do not say whose CPU a module
spends. ``pytest ... --cpu-profile-out PATH`` (``make test PYTEST_ARGS="--cpu-profile-out
.cache/suite_cpu.txt"``) samples the controller's own process tree (the workers and what
they started) once a second: a process's CPU since the last sample goes to the module its pytest-xdist worker
(``PYTEST_XDIST_WORKER`` in its environment, which every child inherits) was running then,
and to its kind (a Spark driver JVM, a Python data source runner, a ``headwater`` CLI process,
...). Processes older than the run count from the first sample; one that starts and ends
between two samples is missed (a CLI process lives seconds, a JVM tens of seconds), and so is
a server that daemonises out of the tree (the session's Postgres, started by ``pg_ctl``).
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from harness.suite_order import module_of

_TICK = os.sysconf("SC_CLK_TCK")
OUTSIDE = "(no worker)"
#: (substring of the command line, kind), first match wins; the command line is read again when
#: the program changes (``spark-class`` is a bash script that execs the driver's JVM).
_KINDS = (
    ("org.apache.spark.launcher.Main", "java: Spark launcher"),
    ("org.apache.spark.deploy.master", "java: Spark standalone master"),
    ("org.apache.spark.deploy.worker", "java: Spark standalone worker"),
    ("CoarseGrainedExecutorBackend", "java: Spark executor"),
    ("SparkSubmit", "java: Spark driver"),
    ("spark-home", "java: Spark driver"),
    ("python_streaming_source_runner", "python: Spark data source runner"),
    ("pyspark.daemon", "python: Spark worker"),
    ("pyspark.worker", "python: Spark worker"),
    ("-m headwater", "python: headwater CLI"),
    ("bin/headwater", "python: headwater CLI"),
    ("debezium", "debezium"),
    ("dagster", "python: dagster"),
    ("moto", "moto (S3)"),
    ("xdist", "python: pytest worker"),
    ("exec(eval(", "python: pytest worker"),
)
_COMMANDS = {"postgres": "postgres", "mariadbd": "mariadb", "tansu": "tansu (broker)", "java": "java: other"}


def kind_of(comm: str, cmdline: str) -> str:
    """A process's kind from its command name and line."""
    for needle, kind in _KINDS:
        if needle in cmdline:
            return kind
    for prefix, kind in _COMMANDS.items():
        if comm.startswith(prefix):
            return kind
    return "python: other" if comm.startswith("python") else f"other: {comm}"


@dataclass
class Timeline:
    """Which module each worker ran when: (start, module) per worker from the test reports."""

    starts: defaultdict[str, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))

    def add(self, worker: str, start: float, nodeid: str) -> None:
        bisect.insort(self.starts[worker], (start, nodeid))

    def test_at(self, worker: str, at: float) -> str:
        """The test ``worker`` had started last at ``at`` (its fixtures' setup counts with it)."""
        runs = self.starts.get(worker)  # "" in a run without workers: every process counts
        if not runs:
            return OUTSIDE
        index = bisect.bisect_right(runs, (at, "\uffff")) - 1
        return runs[index][1] if index >= 0 else "(worker start)"

    def module_at(self, worker: str, at: float) -> str:
        """The module of :meth:`test_at`."""
        return module_of(self.test_at(worker, at))


def command_of(cmdline: str) -> str:
    """A ``headwater`` CLI process's command without its options (``load --follow`` -> ``load``)."""
    words = cmdline.split()
    start = next((i + 1 for i, w in enumerate(words) if w == "headwater" or w.endswith("/headwater")), 0)
    command: list[str] = []
    skip = False
    for word in words[start:]:
        if skip:
            skip = False
        elif word in ("--config", "--log-format"):
            skip = True
        elif not word.startswith("-") and len(command) < 2:
            command.append(word)
    return " ".join(command)


class _Seen(NamedTuple):
    """What the sampler knows of one process: its program, kind, start worker and CPU ticks so far."""

    comm: str
    kind: str
    worker: str
    ticks: int
    command: str = ""


def _stat(pid: str) -> tuple[str, int, int, str] | None:
    """(command name, CPU ticks, start tick, parent pid) of process ``pid``; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    close = text.rfind(")")
    fields = text[close + 2 :].split()
    return text[text.find("(") + 1 : close], int(fields[11]) + int(fields[12]), int(fields[19]), fields[1]


def _describe(pid: str) -> tuple[str, str]:
    """(command line, pytest-xdist worker) of process ``pid``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return "", ""
    worker = next((e[20:].decode() for e in environ if e.startswith(b"PYTEST_XDIST_WORKER=")), "")
    return cmdline, worker


class SuiteCpu:
    """The controller's sampler and report (registered by ``tests/conftest.py`` for ``--cpu-profile-out``)."""

    def __init__(self, out: Path, interval_s: float = 1.0) -> None:
        self.out = out
        self.interval_s = interval_s
        self.timeline = Timeline()
        self.samples: list[tuple[float, str, str, float]] = []  # (time, worker, kind, CPU seconds)
        self._seen: dict[tuple[str, int], _Seen] = {}  # by (pid, start tick)
        self._workers: dict[str, str] = {}  # pid -> id of each pytest-xdist worker process (set after it started)
        self.started: Counter[str] = Counter()  # processes seen per kind (a program exec'd counts again)
        self.births: list[tuple[float, str, str]] = []  # (time first seen, worker, kind) of each process
        self.commands: Counter[str] = Counter()  # CPU seconds of the headwater CLI by command
        self.commands_started: Counter[str] = Counter()
        self._stop = threading.Event()
        self._sample()  # the baseline: CPU spent before the run is not the suite's
        self.samples.clear()
        self.started.clear()
        self.births.clear()
        self.commands.clear()
        self.commands_started.clear()
        self._thread = threading.Thread(target=self._run, name="suite-cpu", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        now = time.time()
        stats = {pid: stat for pid in os.listdir("/proc") if pid.isdigit() and (stat := _stat(pid)) is not None}
        ours = {str(os.getpid())}  # the run's own process tree: other work on the machine is not the suite's
        for pid in stats:
            chain = []
            while pid not in ours and pid in stats and pid not in chain:
                chain.append(pid)
                pid = stats[pid][3]
            if pid in ours:
                ours.update(chain)
        for pid in ours & stats.keys():
            comm, ticks, start, _ = stats[pid]
            known = self._seen.get((pid, start))
            if known is None or known.comm != comm:  # new, or it exec'd another program
                cmdline, worker = _describe(pid)
                kind = kind_of(comm, cmdline)
                command = command_of(cmdline) if kind == "python: headwater CLI" else ""
                known = _Seen(comm, kind, worker, known.ticks if known is not None else 0, command)
                if command:
                    self.commands_started[command] += 1
                self.started[known.kind] += 1
                self.births.append((now, known.worker or self._workers.get(pid, ""), known.kind))
            if ticks > known.ticks:
                worker = known.worker or self._workers.get(pid, "")
                self.samples.append((now, worker, known.kind, (ticks - known.ticks) / _TICK))
                if known.command:
                    self.commands[known.command] += (ticks - known.ticks) / _TICK
            self._seen[(pid, start)] = known._replace(ticks=ticks)

    def pytest_testnodeready(self, node: Any) -> None:
        """A worker's own process: xdist sets ``PYTEST_XDIST_WORKER`` inside it, not in its start environment."""
        self._workers[str(node.gateway._rinfo().pid)] = node.gateway.id

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "setup":
            node = getattr(report, "node", None)
            worker = node.gateway.id if node is not None else os.environ.get("PYTEST_XDIST_WORKER", "")
            self.timeline.add(worker, report.start, report.nodeid)

    def pytest_sessionfinish(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        text = report(self.samples, self.timeline, self.started, self.births)
        text += "\nheadwater CLI by command:\n" + "".join(
            f"{seconds:9,.0f}  {command}  ({self.commands_started[command]:,} processes)\n"
            for command, seconds in self.commands.most_common()
        )
        self.out.write_text(text)


def report(
    samples: list[tuple[float, str, str, float]],
    timeline: Timeline,
    started: Counter[str] | None = None,
    births: list[tuple[float, str, str]] | None = None,
    modules: int = 40,
) -> str:
    """CPU seconds by kind of process (with how many were seen, when known), then by module and by test.

    Each list has the largest first; a test's line says how many Spark driver JVMs it started
    (from ``births``: when each process was first seen, by whom and of what kind).
    """
    by_kind: Counter[str] = Counter()
    by_module: Counter[str] = Counter()
    by_test: Counter[str] = Counter()
    module_kinds: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for at, worker, kind, seconds in samples:
        test = timeline.test_at(worker, at)
        module = module_of(test)
        by_kind[kind] += seconds
        by_module[module] += seconds
        by_test[test] += seconds
        module_kinds[module][kind] += seconds
    drivers: Counter[str] = Counter(
        timeline.test_at(worker, at) for at, worker, kind in births or [] if kind == "java: Spark driver"
    )
    total = sum(by_kind.values()) or 1.0
    lines = [f"CPU seconds sampled: {total:,.0f}", "", "by kind of process:"]
    shown = [(kind, seconds) for kind, seconds in by_kind.most_common() if seconds >= 0.5]
    for kind, seconds in shown:
        count = (started or Counter())[kind]
        each = f"  ({count:,} processes, {seconds / count:.2f} s each)" if count else ""
        lines.append(f"{seconds:9,.0f}  {100 * seconds / total:5.1f} %  {kind}{each}")
    lines += ["", f"by test module (the {modules} largest):"]
    for module, seconds in by_module.most_common(modules):
        top = ", ".join(f"{kind} {s:,.0f}" for kind, s in module_kinds[module].most_common(4))
        lines.append(f"{seconds:9,.0f}  {module}  ({top})")
    lines += ["", f"by test (the {modules} largest):"]
    for test, seconds in by_test.most_common(modules):
        lines.append(f"{seconds:9,.0f}  {test}  ({drivers[test]} Spark drivers started)")
    return "\n".join(lines) + "\n"
