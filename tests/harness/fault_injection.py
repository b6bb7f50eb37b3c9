"""Seeded SIGKILLs of pipeline processes at random moments, each restarted at once.

A :class:`Component` is something that can be started and killed outright: a CLI
process (``headwater capture --follow``, ``feeds run --follow``, ``load --follow``, run in
its own process group so its Spark JVM dies with it) or a broker. :class:`FaultInjector`
keeps every component running and kills each one after a gap drawn from its own
``random.Random(f"{seed}:{name}")``, so the schedule of every component depends only on
the seed, never on how fast the others happen to run. A component that exits on its own
is restarted too and its exit code recorded (the test decides whether that is allowed).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.processes import die_with_parent, stop_at_exit


class Component:
    """Something the injector starts, watches and kills."""

    name: str

    def start(self) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone."""
        raise NotImplementedError

    def exit_code(self) -> int | None:
        """None while running (or never started), else the code it exited with."""
        raise NotImplementedError

    def ready(self, marker: str) -> bool:
        """Whether this run of the component has shown ``marker`` (e.g. its queries started)."""
        return True

    def run_output(self) -> str:
        """What the current (or last) run printed, when known."""
        return ""


class CliProcess(Component):
    """One command in its own session (process group); stdout+stderr appended to ``<logs>/<name>.log``."""

    def __init__(self, name: str, argv: Sequence[str], logs: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = logs / f"{name}.log"
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._output_from = 0
        stop_at_exit(self.kill)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self._output_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as out:
            out.write(f"\n===== start {self.starts} at {time.time():.3f}: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # killpg reaches the Spark JVM (spark-submit) as well
                preexec_fn=die_with_parent,
            )

    def kill(self) -> None:
        process = self.process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def ready(self, marker: str) -> bool:
        return marker in self.run_output()

    def run_output(self) -> str:
        with self.log_path.open("rb") as out:
            out.seek(self._output_from)
            return out.read().decode(errors="replace")

    def tail(self, chars: int = 3000) -> str:
        """The end of this component's output, for assertion messages."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class BrokerProcess(Component):
    """A :class:`harness.broker.TansuBroker` (on persistent storage, or a kill loses the log)."""

    def __init__(self, broker: Any, name: str = "broker") -> None:
        self.name = name
        self.broker = broker

    def start(self) -> None:
        if self.exit_code() is not None or self.broker.process is None:  # idempotent: may run already
            self.broker.start()

    def kill(self) -> None:
        self.broker.kill()

    def exit_code(self) -> int | None:
        process = self.broker.process
        return None if process is None else process.poll()


@dataclass
class Schedule:
    """Kill one component ``kills`` times, each ``gap_s`` (uniform) after it (re)started.

    With ``ready_marker``, the gap counts from the moment this run's output shows the
    marker (a Spark job's queries have started), so kills land mid-batch or between
    batches rather than all during a start-up of ~10-30 s.
    """

    kills: int
    gap_s: tuple[float, float]
    ready_marker: str | None = None


@dataclass
class _Slot:
    component: Component
    schedule: Schedule
    rng: random.Random
    kill_at: float | None = None
    kills: int = 0
    own_exits: list[tuple[int, str]] = field(default_factory=list)


class FaultInjector:
    """Keep components running; SIGKILL each by its seeded schedule and restart it at once."""

    def __init__(self, seed: int, plan: Sequence[tuple[Component, Schedule]], *, poll_s: float = 0.05) -> None:
        self.seed = seed
        self._slots = [_Slot(c, s, random.Random(f"{seed}:{c.name}")) for c, s in plan]
        self._poll_s = poll_s
        self.events: list[str] = []
        #: Wall-clock time (epoch s) at which :meth:`run` began: the zero of :attr:`events`.
        self.started_wall = 0.0

    def start(self, ready_within_s: float = 180.0) -> None:
        """Start every component in plan order; one with a ready marker is waited for before the next starts.

        (A warehouse load of a feed needs the feed's topic and schema, which the feed job
        writes when it starts.) Raises if a component does not get ready in time.
        """
        for slot in self._slots:
            self._start(slot)
            marker = slot.schedule.ready_marker
            deadline = time.monotonic() + ready_within_s
            while marker is not None and not slot.component.ready(marker):
                code = slot.component.exit_code()
                if code is not None or time.monotonic() > deadline:
                    output = slot.component.run_output()[-3000:]
                    msg = f"{slot.component.name} not ready (exit code {code}) within {ready_within_s}s:\n{output}"
                    raise RuntimeError(msg)
                time.sleep(self._poll_s)

    def _start(self, slot: _Slot) -> None:
        slot.component.start()
        slot.kill_at = None
        if slot.schedule.ready_marker is None:
            slot.kill_at = time.monotonic() + slot.rng.uniform(*slot.schedule.gap_s)

    def _arm(self, slot: _Slot, now: float) -> None:
        marker = slot.schedule.ready_marker
        if slot.kill_at is None and marker is not None and slot.component.ready(marker):
            slot.kill_at = now + slot.rng.uniform(*slot.schedule.gap_s)

    def done(self) -> bool:
        """Every component has had its kills."""
        return all(slot.kills >= slot.schedule.kills for slot in self._slots)

    def run(self, deadline_s: float, on_tick: Callable[[], None] | None = None) -> None:
        """Kill and restart until :meth:`done` or ``deadline_s`` seconds have passed."""
        started = time.monotonic()
        self.started_wall = time.time()
        while not self.done() and time.monotonic() - started < deadline_s:
            now = time.monotonic()
            for slot in self._slots:
                component = slot.component
                code = component.exit_code()
                if code is not None:  # exited by itself: note it, restart
                    slot.own_exits.append((code, component.run_output()))
                    self.events.append(f"{now - started:7.2f}s {component.name} exited with {code}; restarted")
                    self._start(slot)
                    continue
                self._arm(slot, now)
                if slot.kills < slot.schedule.kills and slot.kill_at is not None and now >= slot.kill_at:
                    component.kill()
                    slot.kills += 1
                    self.events.append(f"{now - started:7.2f}s SIGKILL {component.name} #{slot.kills}")
                    self._start(slot)
            if on_tick is not None:
                on_tick()
            time.sleep(self._poll_s)

    def stop(self) -> None:
        """SIGKILL whatever still runs (not counted as a fault: the pipeline must not care)."""
        for slot in self._slots:
            slot.component.kill()

    def kills(self) -> dict[str, int]:
        """Kills per component name."""
        return {slot.component.name: slot.kills for slot in self._slots}

    def own_exits(self) -> dict[str, list[tuple[int, str]]]:
        """``(exit code, output of that run)`` of each exit without a kill, by component name."""
        return {slot.component.name: slot.own_exits for slot in self._slots if slot.own_exits}
