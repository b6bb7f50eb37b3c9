"""Files replaced whole: a reader sees the old content or the new one, never a mix.

Every small state file Headwater keeps (config written by ``source add``, snapshot and
resync progress, version pointers, compaction checkpoints, reports) goes through
:func:`replace_file`: write a temporary file beside the target, fsync it, rename it over
the target, fsync the directory. Once it returns (``durable=True``) the new content
survives a crash of the process or the machine.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import orjson


def fsync_directory(directory: Path) -> None:
    """Make creations, renames and deletions inside ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes, *, mode: int | None = None, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically (creating its folder); fsynced when ``durable``.

    ``mode`` sets the file's permissions (default: the temporary file's, 0600).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    if durable:
        fsync_directory(path.parent)


def replace_json(path: Path, body: object, *, indent: bool = False) -> None:
    """Replace ``path`` with ``body`` as JSON, atomically and durably (see :func:`replace_file`)."""
    replace_file(path, orjson.dumps(body, option=orjson.OPT_INDENT_2 if indent else 0))
