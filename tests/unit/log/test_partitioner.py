import pytest

from log.partitioner import murmur2, partition_for


# Vectors from Kafka's UtilsTest.testMurmur2 (clients/src/test/java/.../UtilsTest.java).
@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (bytes([ord("a"), ord("b"), ord("c")]), 479470107),
        (b"", 275646681),
    ],
)
def test_murmur2_matches_kafka(key, expected):
    assert murmur2(key) == expected


def test_partition_is_kafka_default_partitioner():
    # Kafka: Utils.toPositive(Utils.murmur2(keyBytes)) % numPartitions
    assert partition_for(b"21", 3) == (-973932308 & 0x7FFFFFFF) % 3
    assert all(0 <= partition_for(str(i).encode(), 7) < 7 for i in range(1000))


def test_null_key_goes_to_partition_zero():
    assert partition_for(None, 5) == 0
