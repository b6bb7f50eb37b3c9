"""spark_log."""
