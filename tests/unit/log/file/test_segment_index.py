from log.file.segment_index import INDEX_INTERVAL_BYTES, SegmentIndex, index_path, time_index_path, write_index_files


def test_sparse_cadence_and_lookups():
    index = SegmentIndex()
    assert index.wants(0)
    index.add(0, 0, 100)
    assert not index.wants(INDEX_INTERVAL_BYTES - 1)
    assert index.wants(INDEX_INTERVAL_BYTES)
    index.add(50, 5000, 300)
    index.add(90, 9000, 300)
    index.add(120, 13000, 900)
    assert index.floor(-1) == -1
    assert index.floor(0) == 0
    assert index.floor(89) == 1
    assert index.floor(10_000) == 3
    # Batches before entry i are older than t when max_ts[i] < t.
    assert index.before_time(100) == -1
    assert index.before_time(101) == 0
    assert index.before_time(301) == 2
    assert index.before_time(10_000) == 3


def test_add_ignores_positions_not_beyond_the_last():
    index = SegmentIndex()
    assert index.add(0, 0, 1)
    assert not index.add(5, 0, 1)


def test_truncate_drops_entries_at_or_after_position():
    index = SegmentIndex()
    for i in range(4):
        index.add(i * 10, i * 5000, i)
    index.truncate(10_000)
    assert index.positions == [0, 5000]


def test_files_round_trip_and_torn_or_missing_files(tmp_path):
    log_path = tmp_path / "00000000000000000000.log"
    assert SegmentIndex.load(log_path).bases == []
    index = SegmentIndex()
    for i in range(3):
        index.add(i * 10, i * 5000, 100 + i)
    write_index_files(log_path, index)
    loaded = SegmentIndex.load(log_path)
    assert (loaded.bases, loaded.positions, loaded.max_ts) == (index.bases, index.positions, index.max_ts)
    # A torn last entry (crash while appending an entry) is ignored.
    with open(index_path(log_path), "ab") as fh:
        fh.write(b"\x01\x02\x03")
    assert SegmentIndex.load(log_path).bases == [0, 10, 20]
    # Disagreeing files are cut at the first disagreement.
    data = bytearray(time_index_path(log_path).read_bytes())
    data[16 + 8] ^= 1
    time_index_path(log_path).write_bytes(bytes(data))
    assert SegmentIndex.load(log_path).bases == [0]
