"""The last error of each stage command, kept for ``headwater status``."""

from __future__ import annotations

from pathlib import Path

from core.config import load_config
from log.errors import CorruptLogError, LogUnavailableError
from operations.stage_errors import forget, last_errors, remember


def test_the_last_error_of_each_stage_is_kept_until_it_ends_cleanly(tmp_path: Path) -> None:
    (tmp_path / "headwater.yaml").write_text("project: p\n")
    config = load_config(tmp_path / "headwater.yaml")
    assert last_errors(config) == []
    remember(config, "load", LogUnavailableError("broker down"))
    remember(config, "load", CorruptLogError("/h/log/t/0/00000000000000000000.log", 0, "damaged batch"))
    remember(config, "feeds run", LogUnavailableError("broker\ndown;   again"))
    shown = {row["stage"]: row for row in last_errors(config)}
    assert set(shown) == {"load", "feeds run"}
    assert shown["load"]["error"].startswith("corrupt log segment /h/log/t/0/00000000000000000000.log")
    assert shown["load"]["exit_code"] == 3
    assert shown["feeds run"] == {**shown["feeds run"], "error": "broker down; again", "exit_code": 1}
    forget(config, "load")
    assert [row["stage"] for row in last_errors(config)] == ["feeds run"]
    forget(config, "load")  # nothing kept: nothing to do
