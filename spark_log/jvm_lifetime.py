"""A Spark driver JVM that dies with its Python driver, at once, however the driver ends.

pyspark's gateway JVM calls ``System.exit`` when its stdin closes (the Python driver
exited), and ``System.exit`` runs Spark's shutdown hooks, which with streaming queries
running can take many minutes: JVMs with their 1 GB heap were seen alive 16 and 40 minutes
after a ``load --follow`` was SIGKILLed. So the JVM gets the kernel's parent-death signal,
SIGKILL (:mod:`core.process_lifetime`): nothing of a SIGKILLed driver's JVM needs to run,
since every Headwater Spark job resumes from its checkpoint. The Python workers and data
source runners the JVM started exit when their connection to it closes (the daemon on its
stdin, the runners on their socket).

pyspark starts the JVM with its own ``preexec_fn`` (which ignores SIGINT); :func:`install`
wraps the ``Popen`` pyspark's launcher calls so that ``preexec_fn`` also arms the signal.
A session started from a thread other than the main one goes without (the signal would fire
when that thread ends); such a JVM still exits on stdin EOF.
"""

from __future__ import annotations

import signal
import subprocess
from typing import Any

from core.process_lifetime import parent_death_preexec


def _popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
    kwargs["preexec_fn"] = parent_death_preexec(signal.SIGKILL, then=kwargs.get("preexec_fn"))
    return subprocess.Popen(*args, **kwargs)


def install() -> None:
    """Make every Spark driver JVM this process launches from now on die with it (idempotent)."""
    from pyspark import java_gateway

    java_gateway.Popen = _popen  # type: ignore[attr-defined,assignment]
