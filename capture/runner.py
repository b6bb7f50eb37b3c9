"""Run capture agents for several sources at once (threads), stopping them together."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

from capture.agent import CaptureAgent
from capture.catalog import typemap_decoders
from capture.errors import UnknownSourceError
from capture.registration import connect
from capture.resync import capture_state_dir
from capture.snapshot_plan import SnapshotProgress
from capture.stats import CaptureStats
from core.config import ProjectConfig
from log.factory import open_log

#: Makes the snapshot progress display of one source (None: no display).
ProgressFactory = Callable[[str], SnapshotProgress | None]


def run_capture(
    config: ProjectConfig,
    names: tuple[str, ...],
    *,
    until_caught_up: bool,
    progress: ProgressFactory | None = None,
) -> dict[str, CaptureStats]:
    """Run one agent per source (threads), until caught up or until stopped.

    In the main thread, SIGINT/SIGTERM make every agent finish the transaction in hand,
    append and acknowledge it, and return.
    """
    selected = names or tuple(config.sources)
    for name in selected:
        if name not in config.sources:
            msg = (
                f"no source named {name!r}; known: {', '.join(config.sources) or 'none'} (see 'headwater source list')"
            )
            raise UnknownSourceError(msg, source=name)
        # Fail fast with registration's one-line errors (login, TLS/sslmode, unreachable), password scrubbed.
        connect(config.sources[name].dsn.get_secret_value(), source=name).close()
    log = open_log(config)
    agents = [
        CaptureAgent(
            name,
            config.sources[name],
            log,
            config.log,
            typemap_decoders(config.sources[name].types),
            state_dir=capture_state_dir(config, name),
            progress=progress(name) if progress is not None else None,
        )
        for name in selected
    ]
    errors: list[BaseException] = []
    results: dict[str, CaptureStats] = {}

    def run(agent: CaptureAgent) -> None:
        try:
            results[agent.name] = agent.run(until_caught_up=until_caught_up)
        except BaseException as exc:  # re-raised in the main thread
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
