"""The Delta table format (delta-rs): the exactly-once writer and DuckDB scans of Delta tables."""
