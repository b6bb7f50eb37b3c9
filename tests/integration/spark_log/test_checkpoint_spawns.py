"""A streaming query's checkpoint writes start no child process in the driver.

Without Hadoop's native library, Hadoop's FileContext renames a local file by running
``readlink`` twice as a child process; Spark's default checkpoint manager renames every offset,
commit and source log entry that way (~18 process spawns per micro-batch, over a quarter of a small
micro-batch's CPU in ``bench/follow_cpu_bench.py``). The session (``spark_log.session``) uses
the FileSystem-based manager instead. JFR's ``jdk.ProcessStart`` events, recorded inside the
session's JVM, count the spawns; the same query with Spark's default manager is the control
(so the check can fail).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_KEY = "spark.sql.streaming.checkpointFileManagerClass"
_FILE_CONTEXT = "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"


def _spawned_commands(spark: Any, root: Path, manager: str | None) -> list[str]:
    """The commands the JVM started while a three-batch file-source query ran with ``manager``."""
    jvm = spark.sparkContext._jvm
    source = root / "in"
    source.mkdir(parents=True)
    before = spark.conf.get(_KEY, None)
    if manager is not None:
        spark.conf.set(_KEY, manager)
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
        if manager is not None:
            if before is None:
                spark.conf.unset(_KEY)
            else:
                spark.conf.set(_KEY, before)
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
