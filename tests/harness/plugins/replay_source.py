"""A source kind that replays a recorded file of changes (``kind: replay``; ``dsn``: the file's path).

The recording is JSON lines, in commit order: a table line
``{"table": "public.items", "columns": [{"name", "logical", "native", "key"}]}`` declares (or changes)
a table's shape; a change line ``{"table", "op": "c"|"u"|"d", "key": {...}, "after": {...},
"ts_us"}`` is one committed transaction of one change. A change's position is its line number
(:class:`Line`); it is acknowledged to ``<home>/capture/<name>/acked.json`` only after the log
stored it (the source-neutral :class:`capture.appender.Appender`), and a restart resumes after
the last acknowledged line, skipping what the log already holds (:class:`capture.position.ResumePoint`).
Its events carry this kind's own ``source`` block (``connector: replay``, ``line``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import total_ordering
from pathlib import Path
from typing import Any

import orjson

from capture.appender import Appender
from capture.errors import CaptureError, PermanentError
from capture.position import ResumePoint
from capture.records import OutRecord, SchemaRecord
from capture.source_kind import Outcome, SnapshotRequest, SourceRequest, SourceView
from capture.source_topics import SourceTopics
from capture.stats import CaptureStats
from core.config import ProjectConfig
from core.durable_files import replace_json
from log.envelope import EVENT_VERSION, ChangeEvent, Op, SnapshotMarker, SourceInfo, encode_key, encode_value
from log.table_schemas import latest_schemas
from log.topics import table_topic

#: Lines appended per flush (a flush appends, then acknowledges its last line).
BATCH_LINES = 50


class ReplayError(CaptureError, PermanentError):
    """A recording that cannot be replayed."""


@total_ordering
@dataclass(frozen=True, slots=True)
class Line:
    """A position in a recording: the line number (1-based) of the last change."""

    number: int

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Line):
            return NotImplemented
        return self.number < other.number

    def __str__(self) -> str:
        return f"line {self.number}"

    def ordinal(self) -> int:
        """The line number itself: later lines sort later."""
        return self.number


class Acked:
    """Where the replay acknowledges positions: a file beside the source's capture state."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> Line:
        return Line(json.loads(self.path.read_text())["line"]) if self.path.exists() else Line(0)

    def send_status(self, position: Any) -> None:
        replace_json(self.path, {"line": position.number})


def _source_block(name: str, table: str, line: int, ts_us: int) -> SourceInfo:
    schema, _, relation = table.partition(".")
    return SourceInfo(
        {
            "version": EVENT_VERSION,
            "connector": "replay",
            "name": name,
            "ts_ms": ts_us // 1000,
            "ts_us": ts_us,
            "ts_ns": ts_us * 1000,
            "snapshot": SnapshotMarker.FALSE.value,
            "db": "recording",
            "schema": schema,
            "table": relation,
            "line": line,
            "commit_lsn": line,
            "txn_index": 0,
        }
    )


class ReplayAgent:
    """Replays one recording into the log (see the module docstring)."""

    def __init__(self, config: ProjectConfig, name: str, log: Any) -> None:
        self.name = name
        source = config.sources[name]
        self._file = Path(source.dsn.get_secret_value())
        self._log = log
        self._acked = Acked(config.home_dir / "capture" / name / "acked.json")
        self.stats = CaptureStats(self._acked.load())
        self._stop = threading.Event()
        self._topics = SourceTopics(log, config.log, name)
        self._appender = Appender(name, log, self._topics, self.stats, self._stop, retry_s=0.2, on_flushed=lambda: None)
        #: The latest schema record of each topic the log holds (so a restart re-records nothing unchanged).
        self._latest = latest_schemas(log, f"{name}.")

    def stop(self) -> None:
        self._stop.set()

    def _schema(self, entry: dict[str, Any]) -> SchemaRecord | None:
        topic = table_topic(self.name, *entry["table"].split(".", 1))
        latest = self._latest.get(topic)
        if latest is not None and latest["columns"] == entry["columns"]:
            return None
        schema, _, table = entry["table"].partition(".")
        value = {
            "topic": topic,
            "schema": schema,
            "table": table,
            "replica_identity": "d",
            "key": [c["name"] for c in entry["columns"] if c.get("key")],
            "key_source": "primary_key",
            "columns": entry["columns"],
            "version": 1 if latest is None else int(latest["version"]) + 1,
        }
        self._latest[topic] = value
        return SchemaRecord(topic, orjson.dumps(value))

    def _records(self, entry: dict[str, Any], line: int) -> list[OutRecord]:
        topic = table_topic(self.name, *entry["table"].split(".", 1))
        op = Op(entry["op"])
        source = _source_block(self.name, entry["table"], line, entry["ts_us"])
        key = encode_key(entry["key"])
        after = None if op is Op.DELETE else entry["after"]
        before = entry["key"] if op is Op.DELETE else None
        event = ChangeEvent(op, source, before=before, after=after, ts_us=entry["ts_us"])
        records = [OutRecord(topic, key, encode_value(event), line, 0)]
        if op is Op.DELETE:
            records.append(OutRecord(topic, key, None, line, 0))  # the tombstone compaction drops the key by
        return records

    def run(self, *, until_caught_up: bool) -> CaptureStats:
        """Replay the lines after the last acknowledged one (this kind is always caught up at the file's end)."""
        if not self._file.exists():
            msg = f"source {self.name}: recording {self._file} does not exist"
            raise ReplayError(msg, source=self.name)
        resume = ResumePoint.load(self._log, self._topics.of_source())
        acked = self.stats.acked.ordinal()
        appender = self._appender
        with self._file.open() as lines:
            for number, text in enumerate(lines, start=1):
                entry = json.loads(text)
                if "columns" in entry:
                    schema = self._schema(entry)
                    if schema is not None:
                        appender.schemas.append(schema)
                    continue
                if number <= acked:
                    continue
                appender.records.extend(self._records(entry, number))
                self.stats.transactions += 1
                self.stats.events += 1
                appender.end = Line(number)
                if len(appender.records) >= BATCH_LINES:
                    appender.flush(resume, self._acked)
                if self._stop.is_set():
                    break
        appender.flush(resume, self._acked)
        return self.stats


class ReplaySource:
    """The ``replay`` kind (see the module docstring)."""

    name = "replay"

    def add(self, config_path: Path, request: SourceRequest, *, confirm: Any) -> Outcome:
        msg = "replay sources are written into headwater.yaml by hand (kind: replay, dsn: <recording>)"
        raise ReplayError(msg, source=request.name)

    def show(self, config: ProjectConfig, name: str) -> SourceView:
        status = self.status(config, name)
        rows = (
            ("source", name),
            ("kind", self.name),
            ("recording", status["dsn"]),
            ("acknowledged", status["position"]),
        )
        return SourceView(name, self.name, rows, status)

    def removal_question(self, config: ProjectConfig, name: str) -> str:
        return f"remove replay source {name}?"

    def remove(self, config_path: Path, name: str) -> Outcome:
        msg = "remove a replay source from headwater.yaml by hand"
        raise ReplayError(msg, source=name)

    def check(self, config: ProjectConfig, name: str) -> None:
        path = Path(config.sources[name].dsn.get_secret_value())
        if not path.exists():
            msg = f"source {name}: recording {path} does not exist; fix sources.{name}.dsn"
            raise ReplayError(msg, source=name)

    def status(self, config: ProjectConfig, name: str) -> dict[str, Any]:
        acked = Acked(config.home_dir / "capture" / name / "acked.json").load()
        recording = config.sources[name].dsn.get_secret_value()
        return {"source": name, "kind": self.name, "dsn": recording, "position": str(acked)}

    def prepare_process(self) -> None:
        """Nothing to prepare."""

    def holder(self, config: ProjectConfig, name: str) -> Any:
        return None  # the lease alone serialises replays

    def agent(self, config: ProjectConfig, name: str, log: Any, *, progress: Any) -> ReplayAgent:
        return ReplayAgent(config, name, log)

    def request_snapshot(
        self, config: ProjectConfig, name: str, tables: Sequence[str], *, captured_only: bool = False
    ) -> SnapshotRequest:
        msg = f"source {name}: a replay has no snapshots; 'headwater source resync {name}' replays it all"
        raise ReplayError(msg, source=name)

    def snapshot_done(self, config: ProjectConfig, name: str, request_id: str) -> bool:
        return True

    def resync_question(self, config: ProjectConfig, name: str) -> str:
        return f"replay the whole recording of source {name} again?"

    def resync(self, config: ProjectConfig, name: str, *, confirm: Any) -> Outcome:
        Acked(config.home_dir / "capture" / name / "acked.json").send_status(Line(0))
        return Outcome(name, f"source {name}: the next capture replays from line 1", f"headwater capture {name}")

    def split_tables(self, text: str, *, what: str) -> list[str]:
        return [part.strip() for part in text.split(",") if part.strip()]

    def table_topics(self, name: str, tables: Sequence[str]) -> list[str]:
        return [table_topic(name, *table.split(".", 1)) for table in tables]
