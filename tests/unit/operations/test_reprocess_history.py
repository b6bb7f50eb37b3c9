"""``headwater reprocess`` of an SCD2 table refuses a topic compaction already cleaned, before Spark starts."""

import subprocess
import sys

from core.config import load_config
from log.base import Record, TopicSpec
from log.file.backend import FileLog
from operations.reprocess import check_history

CONFIG = """project: p
warehouse:
  tables:
    hist: {from: shop.public.t, mode: scd2}
    current: {from: shop.public.t, mode: scd1}
"""


def compacted_project(tmp_path):
    (tmp_path / "headwater.yaml").write_text(CONFIG)
    with FileLog(tmp_path / ".headwater" / "log", segment_bytes=1024) as log:
        log.create_topic(TopicSpec("shop.public.t", partitions=1, min_compaction_lag_ms=0))
        for i in range(60):
            log.append("shop.public.t", 0, [Record(b'{"id":%d}' % (i % 3), b"{}" + b" " * 100)])
        log.compact("shop.public.t")
        return log.clean_offset("shop.public.t", 0)


def test_reprocess_of_an_scd2_table_refuses_in_one_line_naming_the_clean_offset(tmp_path):
    clean = compacted_project(tmp_path)
    assert clean > 0
    result = subprocess.run(
        [sys.executable, "-m", "headwater", "reprocess", "hist"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 3
    assert result.stderr.strip().splitlines() == [
        f"error: partition 0 of 'shop.public.t' holds every version only from offset {clean} on "
        "(compaction or retention removed records before it), but rebuilding the history of SCD2 table 'hist' "
        "needs offset 0; pass --accept-incomplete-history to rebuild it from what the log still holds "
        "(older versions missing)"
    ]


def test_scd1_tables_and_uncleaned_topics_pass(tmp_path):
    compacted_project(tmp_path)
    config = load_config(tmp_path / "headwater.yaml")
    with FileLog(tmp_path / ".headwater" / "log") as log:
        check_history(config, log, "current")  # SCD1 needs only the latest record per key
        log.create_topic(TopicSpec("shop.public.u", partitions=1))
        (tmp_path / "headwater.yaml").write_text(CONFIG.replace("shop.public.t", "shop.public.u"))
        check_history(load_config(tmp_path / "headwater.yaml"), log, "hist")
