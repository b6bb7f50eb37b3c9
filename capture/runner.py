"""Run capture agents for several sources at once (threads), stopping them together.

One process at a time captures a source: the runner holds each source's lease
(:mod:`core.leases`) and waits until its slot is free before streaming, and names the
holder when it is not (:mod:`capture.postgres.registration.slot_holder`).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

from capture.errors import SchemaChangeError, UnknownSourceError
from capture.kinds import kind_of
from capture.source_kind import Agent, SnapshotProgress
from capture.stats import CaptureStats
from core import stop_request
from core.config import ProjectConfig
from core.leases import Holder, LeaseWait, acquire, lease
from core.stage_problems import clear_problem, record_problem
from log.factory import open_log

#: Makes the snapshot progress display of one source (None: no display).
ProgressFactory = Callable[[str], SnapshotProgress | None]
#: How long a capture waits for a source another process captures, unless told otherwise
#: (a capture that just stopped may keep its slot active for a moment).
DEFAULT_HOLDER_WAIT = LeaseWait(timeout_s=5.0)


def run_capture(
    config: ProjectConfig,
    names: tuple[str, ...],
    *,
    until_caught_up: bool,
    progress: ProgressFactory | None = None,
    holder_wait: LeaseWait = DEFAULT_HOLDER_WAIT,
    observe: Callable[[str, CaptureStats], None] | None = None,
) -> dict[str, CaptureStats]:
    """Run one agent per source (threads), until caught up or until stopped.

    Another process capturing a source is waited for as ``holder_wait`` says
    (:class:`core.leases.HeldError` naming it when the wait ends). ``observe`` is given each
    agent's live counters before it starts. In the main thread, SIGINT/SIGTERM make every
    agent finish the transaction in hand, append and acknowledge it, and return.
    """
    selected = names or tuple(config.sources)
    for name in selected:
        if name not in config.sources:
            msg = (
                f"no source named {name!r}; known: {', '.join(config.sources) or 'none'} (see 'headwater source list')"
            )
            raise UnknownSourceError(msg, source=name)
        # Fail fast with the kind's one-line errors (login, TLS/sslmode, unreachable), password scrubbed.
        kind_of(config, name).check(config, name)
    for kind in {kind_of(config, name).name: kind_of(config, name) for name in selected}.values():
        kind.prepare_process()
    leases = [lease(config.home_dir, "capture", name) for name in selected]
    acquire(leases, holder_wait, is_free=lambda: _captured_elsewhere(config, selected))
    try:
        return _run_agents(config, selected, until_caught_up=until_caught_up, progress=progress, observe=observe)
    finally:
        for held in leases:
            held.release()


def _captured_elsewhere(config: ProjectConfig, names: tuple[str, ...]) -> Holder | None:
    """The first process elsewhere that captures one of these sources (e.g. streams from its slot)."""
    for name in names:
        holder = kind_of(config, name).holder(config, name)
        if holder is not None:
            return holder
    return None


def _run_agents(
    config: ProjectConfig,
    selected: tuple[str, ...],
    *,
    until_caught_up: bool,
    progress: ProgressFactory | None,
    observe: Callable[[str, CaptureStats], None] | None,
) -> dict[str, CaptureStats]:
    log = open_log(config)
    agents = [
        kind_of(config, name).agent(config, name, log, progress=progress(name) if progress is not None else None)
        for name in selected
    ]
    for agent in agents:
        if observe is not None:
            observe(agent.name, agent.stats)
    errors: list[BaseException] = []
    results: dict[str, CaptureStats] = {}

    def run(agent: Agent) -> None:
        try:
            clear_problem(config.home_dir, "capture", agent.name)
            results[agent.name] = agent.run(until_caught_up=until_caught_up)
        except BaseException as exc:  # re-raised in the main thread
            if isinstance(exc, SchemaChangeError):  # waits for an operator: status shows why
                record_problem(config.home_dir, "capture", agent.name, str(exc))
            errors.append(exc)
            for other in agents:
                other.stop()

    threads = [threading.Thread(target=run, args=(agent,), name=f"capture-{agent.name}") for agent in agents]

    def stop_all(_signum: int, _frame: FrameType | None) -> None:
        # Each agent finishes the transaction in hand, appends and acknowledges it, then returns.
        for agent in agents:
            agent.stop()

    in_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, stop_all) for sig in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
    if stop_request.requested.is_set():  # asked before the handlers above
        stop_all(signal.SIGTERM, None)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.close()
    if errors:
        raise errors[0]
    return results
