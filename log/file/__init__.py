"""log/file."""
