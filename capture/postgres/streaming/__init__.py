"""Streaming a PostgreSQL source: the replication connection and session, transactions, markers, signals."""
