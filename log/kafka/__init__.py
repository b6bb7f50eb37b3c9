"""log/kafka."""
