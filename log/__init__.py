"""The unified log: records, the Log protocol, the file and Kafka backends, compaction."""
