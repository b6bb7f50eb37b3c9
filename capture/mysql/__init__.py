"""Capture from MySQL and MariaDB: the binlog (row events with full images) into the same log.

Self-contained until the source interface of issue 28 exists: nothing here imports the
PostgreSQL capture. ``binlog/`` reads and decodes the replication stream (bytes -> events),
``types/`` maps column values to Debezium's MySQL connector JSON in each handling mode.
"""
