import pytest

from log.base import TopicSpec
from log.file_log import FileLog


@pytest.fixture
def file_log(tmp_path):
    log = FileLog(tmp_path / "log", fsync="always", segment_bytes=4096)
    yield log
    log.close()


@pytest.fixture
def topic(file_log):
    file_log.create_topic(TopicSpec("orders", partitions=2, min_compaction_lag_ms=0, delete_retention_ms=0))
    return "orders"
