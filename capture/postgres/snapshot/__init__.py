"""Snapshots of a PostgreSQL source: initial (COPY), incremental (watermarks) and resync."""
