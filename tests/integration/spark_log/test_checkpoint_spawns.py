"""A streaming query's checkpoint writes start no child process in the driver.

Without Hadoop's native library, Hadoop's FileContext renames a local file by running
``readlink`` twice as a child process; Spark's default checkpoint manager renames every offset,
commit and source log entry that way (~18 process spawns per micro-batch, over a quarter of a small
micro-batch's CPU in ``bench/follow_cpu_bench.py``). The session (``spark_log.session``) uses
the FileSystem-based manager instead. And Hadoop's local file system sets the permission of every
file it creates by running ``chmod`` (three more per micro-batch): the session's local file system
(``spark_log.nio_filesystem``) sets them through java.nio. JFR's ``jdk.ProcessStart`` events,
recorded inside the session's JVM, count the spawns; the same query with Spark's default manager,
and with Hadoop's local file system, are the controls (so each check can fail).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from spark_log.nio_filesystem import FILE_SYSTEM_CLASS

_KEY = "spark.sql.streaming.checkpointFileManagerClass"
_FILE_CONTEXT = "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"


#: Hadoop's own local file system, uncached (a cached instance of the session's class would be reused).
_HADOOPS_FILE_SYSTEM = {"fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem", "fs.file.impl.disable.cache": "true"}


def _spawned_commands(spark: Any, root: Path, manager: str | None, conf: dict[str, str] | None = None) -> list[str]:
    """The commands the JVM started while a three-batch file-source query ran with ``manager`` and ``conf``."""
    jvm = spark.sparkContext._jvm
    source = root / "in"
    source.mkdir(parents=True)
    settings = {**({_KEY: manager} if manager is not None else {}), **(conf or {})}
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    recording = jvm.jdk.jfr.Recording()
    recording.enable("jdk.ProcessStart")
    recording.start()
    try:
        for batch in range(3):
            (source / f"{batch}.json").write_text(json.dumps({"id": batch}) + "\n")
            query = (
                spark.readStream.schema("id INT")
                .option("maxFilesPerTrigger", 1)
                .json(str(source))
                .writeStream.format("noop")
                .option("checkpointLocation", str(root / "checkpoint"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination(120)
    finally:
        recording.stop()
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    dump = jvm.java.io.File(str(root / "spawns.jfr")).toPath()
    recording.dump(dump)
    recording.close()
    events = jvm.jdk.jfr.consumer.RecordingFile.readAllEvents(dump)
    return [str(event.getString("command")) for event in events]


def test_checkpoint_writes_spawn_no_readlink_and_the_default_manager_would(spark, tmp_path):
    ours = _spawned_commands(spark, tmp_path / "ours", None)
    default = _spawned_commands(spark, tmp_path / "default", _FILE_CONTEXT)
    assert sum(command.startswith("readlink") for command in default) >= 3, default  # the control
    assert not [command for command in ours if command.startswith("readlink")], ours


def test_checkpoint_writes_spawn_no_chmod_and_hadoops_local_file_system_would(spark, tmp_path):
    ours = _spawned_commands(spark, tmp_path / "ours", None)
    hadoops = _spawned_commands(spark, tmp_path / "hadoops", None, _HADOOPS_FILE_SYSTEM)
    assert sum(command.startswith("chmod") for command in hadoops) >= 3, hadoops  # the control
    # Only the checkpoint's own children count: the shared JVM may meanwhile clean up after another
    # test's session (`rm -rf` of its artifact directory, seen in a loaded CI run).
    assert not [command for command in ours if command.startswith(("chmod", "readlink"))], ours


def test_the_session_s_local_file_system_sets_the_modes_chmod_would(spark, tmp_path):
    """The nine rwx bits through java.nio; a mode with the sticky bit through Hadoop's chmod."""
    jvm = spark.sparkContext._jvm
    local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark.sparkContext._jsc.hadoopConfiguration())
    assert local.getClass().getName() == FILE_SYSTEM_CLASS
    for mode in (0o640, 0o755, 0o600, 0o444, 0o1777):
        path = tmp_path / f"{mode:o}"
        path.mkdir() if mode & 0o1000 else path.write_text("x")
        local.setPermission(
            jvm.org.apache.hadoop.fs.Path(str(path)), jvm.org.apache.hadoop.fs.permission.FsPermission(f"{mode:o}")
        )
        assert stat.S_IMODE(os.stat(path).st_mode) == mode, f"{mode:o}"
    created = tmp_path / "created"
    out = local.create(jvm.org.apache.hadoop.fs.Path(str(created)), True)
    out.write(b"written")
    out.close()
    assert created.read_bytes() == b"written"
    assert stat.S_IMODE(os.stat(created).st_mode) == 0o644  # Hadoop's default: 0666 less its umask 022
