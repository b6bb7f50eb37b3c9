"""Hadoop's local file system without a ``chmod`` child process per file: a small jar built here once.

Without Hadoop's native library (pyspark ships none), ``RawLocalFileSystem.setPermission`` runs
``chmod`` as a child process of the JVM, and Hadoop sets the permission of every file it creates:
each offset and commit entry of a streaming query and its ``.crc`` file, three process starts per
micro-batch. ``java/NioLocalFileSystem.java`` is Hadoop's ``LocalFileSystem`` with a raw side that
sets the same mode bits through ``java.nio`` (modes beyond ``rwx`` still go Hadoop's way); it took
~17 % off a small micro-batch's CPU (``bench/follow_cpu_bench.py``, bench/RESULTS.md).

The class is compiled once per environment by the ``javac`` beside the ``java`` that runs Spark,
against pyspark's own Hadoop jars, into a jar in Headwater's cache directory. A Java without a
compiler (a JRE), or a build that fails (not tried again until its ``.failed`` file in the cache is
deleted), leaves Spark with Hadoop's class: slower, never wrong.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import zipfile
from pathlib import Path

from core.process_lifetime import parent_death_preexec

#: The class :data:`FS_IMPL_KEY` names when the jar is on the driver's class path.
FILE_SYSTEM_CLASS = "headwater.hadoop.NioLocalFileSystem"
#: The Spark setting that makes Hadoop use it for ``file:`` paths.
FS_IMPL_KEY = "spark.hadoop.fs.file.impl"
_SOURCE = Path(__file__).with_name("java") / "NioLocalFileSystem.java"


def nio_filesystem_jar(java: Path | None, cache_dir: Path) -> Path | None:
    """The jar holding :data:`FILE_SYSTEM_CLASS` for ``java``'s Spark, built if needed; None without a ``javac``."""
    import pyspark

    javac = None if java is None else java.with_name("javac")
    if javac is None or not javac.is_file():
        return None
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    try:
        source = _SOURCE.read_bytes()
        identity = b"\0".join([source, pyspark.__version__.encode(), str(javac.resolve()).encode()])
        jar = cache_dir / f"headwater-hadoop-{hashlib.sha256(identity).hexdigest()[:10]}.jar"
        if jar.is_file():
            return jar
        failed = jar.with_suffix(".failed")  # a build that failed is not tried again at every session
        if failed.exists():
            return None
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".headwater-hadoop-") as building:
            classes = Path(building) / "classes"
            command = [str(javac), "--release", "17", "-nowarn", "-cp", f"{jars}/*", "-d", str(classes), str(_SOURCE)]
            try:
                # Dies with this process (a SIGKILLed CLI leaves no compiler behind); run waits for it,
                # so the thread that armed the signal outlives it.
                preexec = parent_death_preexec(thread_outlives_child=True)
                subprocess.run(command, check=True, capture_output=True, timeout=300, preexec_fn=preexec)
            except subprocess.CalledProcessError:
                failed.touch()
                raise
            packed = Path(building) / "built.jar"
            with zipfile.ZipFile(packed, "w") as archive:
                for compiled in sorted(classes.rglob("*.class")):
                    archive.write(compiled, compiled.relative_to(classes).as_posix())
            os.replace(packed, jar)  # atomic: another process may build the same jar meanwhile
        return jar
    except (OSError, subprocess.SubprocessError):
        return None
