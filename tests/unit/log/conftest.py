import pytest

from log.base import TopicSpec
from log.file.backend import FileLog

#: Segment size per compression: about the same number of batches per segment either way.
SEGMENT_BYTES = {"none": 4096, "zstd": 1024}


@pytest.fixture(params=["none", "zstd"])
def compression(request):
    return request.param


@pytest.fixture
def file_log(tmp_path, compression):
    log = FileLog(tmp_path / "log", fsync="always", segment_bytes=SEGMENT_BYTES[compression], compression=compression)
    yield log
    log.close()


@pytest.fixture
def topic(file_log):
    file_log.create_topic(TopicSpec("orders", partitions=2, min_compaction_lag_ms=0, delete_retention_ms=0))
    return "orders"
