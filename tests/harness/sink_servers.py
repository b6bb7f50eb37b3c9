"""Real servers for the sink tests and benchmarks, each a local process on free ports.

* :class:`RedisServer`: ``redis-server`` with an append-only file (a SIGKILL loses nothing it
  acknowledged), kept in its directory across :meth:`kill` + :meth:`start`.
* :class:`NatsServer`: ``nats-server -js`` with a file store in its directory.
* :class:`RabbitServer`: ``rabbitmq-server`` (Erlang) with its own ``epmd``, node name, ports and
  Mnesia directory; started once per session (about 10-15 s here).
* :class:`WebhookReceiver`: a threading HTTP server in the test process that records every
  batch, answers as told (e.g. 4xx for a poison id) and checks the HMAC signature.

Every process gets the parent-death signal and is stopped at session end (``stop_at_exit``).
The Debian packages ``redis-server``, ``nats-server`` and ``rabbitmq-server`` provide the
binaries (``make prereqs`` installs them).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.server
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from harness.processes import die_with_parent, stop_at_exit
from operations.embedded_postgres import free_port

HOST = "127.0.0.1"


def _wait_for_port(port: int, process: subprocess.Popen[bytes], name: str, timeout_s: float, output: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            # Its own words, so a failed start says why (CI saw RabbitMQ's first start exit with 1 once, cause unknown).
            tail = output.read_bytes()[-3000:].decode(errors="replace") if output.exists() else ""
            raise RuntimeError(f"{name} exited with code {process.returncode} at start; its output ends:\n{tail}")
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{name} did not accept connections on {HOST}:{port} within {timeout_s}s")


def missing_binary(*names: str) -> str | None:
    """The first of ``names`` not on PATH (``/usr/sbin`` included), or None."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/usr/lib/rabbitmq/bin"
    for name in names:
        if shutil.which(name, path=path) is None:
            return name
    return None


class _Server:
    """A server process in its own directory: :meth:`start`, :meth:`kill` (SIGKILL), :meth:`stop`."""

    name = "server"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"hw-{self.name}-"))
        self.port = free_port(HOST)
        self.process: subprocess.Popen[bytes] | None = None
        self._stopper = stop_at_exit(self._remove)

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str] | None:
        return None

    def start(self, timeout_s: float = 30.0) -> Any:
        """Start the server (again, on the same port and data) and wait until it accepts connections."""
        output = self.dir / "out.log"
        self.process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=output.open("ab"),
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
            start_new_session=True,
            env=self.env(),
        )
        _wait_for_port(self.port, self.process, self.name, timeout_s, output)
        return self

    def kill(self) -> None:
        """SIGKILL the whole process group (no shutdown at all); a no-op when not running."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def _remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def close(self) -> None:
        """Stop and remove the directory."""
        self._stopper()


class RedisServer(_Server):
    name = "redis"

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def command(self) -> list[str]:
        return [
            "redis-server",
            "--bind",
            HOST,
            "--port",
            str(self.port),
            "--dir",
            str(self.dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            "no",  # written to the OS before each reply: a process kill loses nothing acknowledged
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
        ]

    def client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url)


class NatsServer(_Server):
    name = "nats"

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    def command(self) -> list[str]:
        return ["nats-server", "-a", HOST, "-p", str(self.port), "-js", "-sd", str(self.dir / "js")]


def quiet_port(host: str = HOST, *, besides: tuple[int, ...] = ()) -> int:
    """A free port below the kernel's ephemeral range, for a server that binds seconds after it is chosen.

    A port from :func:`free_port` is an ephemeral one: while the Erlang VM starts (seconds under
    load), any outgoing connection on the machine may take it as its local port, and the server
    then fails to listen (suspected when RabbitMQ's first start exited with code 1 in a CI run).
    Ports below the range are never handed out to outgoing connections. ``besides``: ports already
    chosen for the same server (not yet bound, so the bind test below cannot see them).
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200 if low > 20000 else 0):  # a range starting at 20000 or lower leaves no quiet ports here
        port = secrets.randbelow(low - 20000) + 20000
        if port in besides:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        return port
    while (port := free_port(host)) in besides:
        pass
    return port


class RabbitServer(_Server):
    """RabbitMQ with its own epmd (a child too, so nothing outlives the session)."""

    name = "rabbitmq"

    def __init__(self) -> None:
        super().__init__()
        self.port = quiet_port()
        self.epmd_port = quiet_port(besides=(self.port,))
        self.dist_port = quiet_port(besides=(self.port, self.epmd_port))
        self.node = f"hw{self.port}@localhost"
        self.epmd: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{HOST}:{self.port}/"

    def command(self) -> list[str]:
        return ["/usr/lib/rabbitmq/bin/rabbitmq-server"]

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HOME": str(self.dir),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.dir / "pid"),
            # exec the VM in place of the script: the parent-death signal and the process group hold for it
            "RUNNING_UNDER_SYSTEMD": "true",
            # one scheduler: the tests and benchmarks share two cores
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "+S 1:1 +A 4 -noinput",
        }

    def start(self, timeout_s: float = 120.0) -> RabbitServer:
        if self.epmd is None or self.epmd.poll() is not None:
            self.epmd = subprocess.Popen(
                ["epmd", "-port", str(self.epmd_port), "-address", HOST],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )
        super().start(timeout_s)
        return self

    def _remove(self) -> None:
        super()._remove()
        if self.epmd is not None and self.epmd.poll() is None:
            self.epmd.kill()
            self.epmd.wait()


class WebhookReceiver:
    """An HTTP server in this process recording each accepted batch (``batches``: lists of elements).

    ``refuse``: ids answered with 422 whenever a batch holds one; ``down``: answer 503 to everything.
    ``secret``: every request must carry a valid signature (else 401, counted in ``bad_signatures``).
    """

    def __init__(self, secret: bytes | None = None, header: str = "X-Headwater-Signature") -> None:
        self.secret = secret
        self.header = header
        self.batches: list[list[dict[str, Any]]] = []
        self.refuse: set[str] = set()
        self.down = False
        self.requests = 0
        self.bad_signatures = 0
        self.on_request: Callable[[], None] | None = None
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status = receiver.handle(body, self.headers.get(receiver.header))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._handler = Handler
        self.port = 0
        self.start()

    def start(self) -> None:
        """Listen (again, on the same port once it had one)."""
        self.server = http.server.ThreadingHTTPServer((HOST, self.port), self._handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def kill(self) -> None:
        """Stop listening: connections are refused until :meth:`start`."""
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/hook"

    def handle(self, body: bytes, signature: str | None) -> int:
        with self._lock:
            self.requests += 1
            if self.on_request is not None:
                self.on_request()
            if self.down:
                return 503
            if self.secret is not None and not self._valid(body, signature):
                self.bad_signatures += 1
                return 401
            elements = orjson.loads(body)
            if any(element["id"] in self.refuse for element in elements):
                return 422
            self.batches.append(elements)
            return 200

    def _valid(self, body: bytes, signature: str | None) -> bool:
        if not signature:
            return False
        parts = dict(part.split("=", 1) for part in signature.split(","))
        expected = hmac.new(self.secret or b"", parts["t"].encode() + b"." + body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, parts.get("v1", "")) and abs(time.time() - int(parts["t"])) < 300

    def elements(self) -> list[dict[str, Any]]:
        with self._lock:
            return [element for batch in self.batches for element in batch]

    def close(self) -> None:
        self.kill()
