"""Streaming from the binlog: row events assembled into whole transactions."""
