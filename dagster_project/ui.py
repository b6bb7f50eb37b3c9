"""Run the Dagster UI for a project: ``dagster-webserver`` + ``dagster-daemon`` as our own children.

``dagster dev`` ignores SIGTERM for 40+ s (measured with Dagster 1.13), so it is not used: the webserver and
the daemon are started directly, each in its own process group (with the code servers
they spawn), and stopped by signalling those groups: SIGINT, then SIGKILL after a
short grace. Ctrl-C reaches only this process (the children are in other sessions),
so stopping is always ours and prompt.

``DAGSTER_HOME`` is ``<home>/dagster``; its ``dagster.yaml`` turns telemetry and the
first-visit popup off, and ``workspace.yaml`` loads ``dagster_project.definitions``
with ``$HEADWATER_CONFIG`` set to the project's file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from core.config import CONFIG_ENV_VAR, ProjectConfig
from core.errors import PermanentError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 3000
_STOP_GRACE_S = 5.0
_INSTANCE_YAML = """\
# Written by 'headwater ui'. Runs, schedules and event logs are stored in this directory (SQLite).
telemetry:
  enabled: false
nux:
  enabled: false
"""


class UiError(PermanentError):
    """The Dagster UI could not start or one of its processes died."""


def dagster_home(config: ProjectConfig) -> Path:
    """``<home>/dagster``: the Dagster instance (runs, schedules, event logs) of this project."""
    return config.home_dir / "dagster"


def prepare_dagster_home(config: ProjectConfig) -> Path:
    """Create ``DAGSTER_HOME`` with its ``dagster.yaml`` (kept if present) and a fresh ``workspace.yaml``."""
    home = dagster_home(config)
    home.mkdir(parents=True, exist_ok=True)
    instance = home / "dagster.yaml"
    if not instance.exists():
        instance.write_text(_INSTANCE_YAML, encoding="utf-8")
    workspace = home / "workspace.yaml"
    workspace.write_text(
        "load_from:\n"
        "  - python_module:\n"
        "      module_name: dagster_project.definitions\n"
        "      attribute: defs\n"
        f"      location_name: {config.project}\n",
        encoding="utf-8",
    )
    return home


def dagster_instance_exists(config: ProjectConfig) -> bool:
    """Whether the project has its Dagster instance (``headwater ui`` and ``headwater demo`` create it).

    Stage commands record their work only into an existing instance: a project nobody watches in
    Dagster does not pay ~1.5 CPU s per command for importing Dagster, opening its storages and
    reading what it records.
    """
    return (dagster_home(config) / "dagster.yaml").exists()


@contextlib.contextmanager
def creating_dagster_instance(config: ProjectConfig) -> Iterator[Path]:
    """``DAGSTER_HOME`` prepared and held for creating its instance: yields the home, one process at a time.

    A fresh instance's SQLite storages are created on first open; two processes doing that at once
    (a webserver, a daemon, a code server, a stage command) can leave two alembic heads
    (dagster#27390), so whoever may be first opens it under this lock.
    """
    home = prepare_dagster_home(config)
    with (home / ".create.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield home


def create_dagster_instance(config: ProjectConfig) -> Path:
    """The project's Dagster instance with its storages created (kept if present); returns its home."""
    with creating_dagster_instance(config) as home:
        if not (home / "history" / "runs.db").exists():
            from dagster import DagsterInstance

            DagsterInstance.from_config(str(home)).dispose()
    return home


def ui_environment(config: ProjectConfig) -> dict[str, str]:
    """The children's environment: ``DAGSTER_HOME`` and ``$HEADWATER_CONFIG`` for this project."""
    env = dict(os.environ)
    env["DAGSTER_HOME"] = str(dagster_home(config).resolve())
    env[CONFIG_ENV_VAR] = str(config.config_path)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


@dataclass
class UiProcesses:
    """The running webserver and daemon."""

    webserver: subprocess.Popen[bytes]
    daemon: subprocess.Popen[bytes]
    url: str

    def stop(self, grace_s: float = _STOP_GRACE_S) -> None:
        """Stop both process groups: SIGINT (as Ctrl-C would), then SIGKILL what is left after ``grace_s``."""
        processes = [self.webserver, self.daemon]
        for process in processes:
            _signal_group(process, signal.SIGINT)
        deadline = time.monotonic() + grace_s
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
        for process in processes:
            # Also the group's other members (code servers), even when the leader already exited.
            _signal_group(process, signal.SIGKILL)
            process.wait()


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _dagster_command(script: str) -> list[str]:
    """A Dagster console script of this interpreter's environment (``.venv/bin/<script>``), else on PATH."""
    beside = Path(sys.executable).parent / script
    found = str(beside) if beside.exists() else shutil.which(script)
    if found is None:
        msg = f"{script} is not installed in this environment; run 'make venv'"
        raise UiError(msg)
    return [found]


def start_ui(config: ProjectConfig, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> UiProcesses:
    """Start the webserver (``host:port``) and the daemon for ``config``'s project; return at once."""
    from dagster_project.recording import record_unrecorded

    home = create_dagster_instance(config)  # here, before the webserver and daemon open it
    # Stage commands run before the instance existed recorded nothing: what they made is recorded now.
    record_unrecorded(config)
    env = ui_environment(config)
    workspace = str(home / "workspace.yaml")
    cwd = str(config.home_dir.parent if config.config_path is None else config.config_path.parent)
    webserver = subprocess.Popen(
        [*_dagster_command("dagster-webserver"), "-h", host, "-p", str(port), "-w", workspace],
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        daemon = subprocess.Popen(
            [*_dagster_command("dagster-daemon"), "run", "-w", workspace],
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    except BaseException:
        _signal_group(webserver, signal.SIGKILL)
        webserver.wait()
        raise
    shown_host = f"[{host}]" if ":" in host else host
    return UiProcesses(webserver=webserver, daemon=daemon, url=f"http://{shown_host}:{port}")


def wait_until_ready(processes: UiProcesses, *, timeout_s: float = 120.0) -> None:
    """Block until the webserver answers ``/server_info``; :class:`UiError` if a process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _check_alive(processes)
        try:
            with urllib.request.urlopen(f"{processes.url}/server_info", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    msg = f"the Dagster webserver did not answer at {processes.url} within {timeout_s:.0f} s; see its output above"
    raise UiError(msg)


def _check_alive(processes: UiProcesses) -> None:
    for name, process in (("dagster-webserver", processes.webserver), ("dagster-daemon", processes.daemon)):
        code = process.poll()
        if code is not None:
            msg = f"{name} exited with code {code}; see its output above (is the port already in use?)"
            raise UiError(msg)


@contextlib.contextmanager
def _interrupt_on_signals() -> Iterator[None]:
    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    # SIGINT gets Python's handler even when we were started ignoring it (a background job):
    # children inherit an ignored signal but not a handler, so they get SIGINT's default too.
    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, interrupt),
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_ui(
    config: ProjectConfig,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the UI until Ctrl-C/SIGTERM (returns) or until a child dies (:class:`UiError`); children always stopped."""
    with _interrupt_on_signals():
        processes = start_ui(config, host=host, port=port)
        try:
            wait_until_ready(processes)
            if on_ready is not None:
                on_ready(processes.url)
            while True:
                _check_alive(processes)
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            processes.stop()
