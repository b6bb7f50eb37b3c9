"""The one line a failed Spark job's error shows: the Python error that caused it, nested ones followed."""

from __future__ import annotations

from pathlib import Path

from spark_log.job import _spark_failure

LOG = Path("/home/logs/spark.log")


def test_a_python_error_in_a_micro_batch_shows_its_own_line() -> None:
    text = (
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
        '  File "/x/load_job.py", line 3, in call\n'
        "    write_batch()\n"
        "ValueError: the batch has 2 versions of key 7\n"
        "\n\tat py4j.Protocol.getReturnValue(Protocol.java:476)\n"
    )
    line = _spark_failure(text, LOG)
    assert line.startswith("the Spark job failed: ValueError: the batch has 2 versions of key 7; details in")


def test_an_error_whose_message_is_a_traceback_shows_the_inner_cause() -> None:
    """DuckDB wraps an exception its Python filesystem raised as ``duckdb.Error: Traceback ...``."""
    text = (
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
        '  File "/x/iceberg/scan.py", line 297, in select_rows\n'
        "    return con.sql(sql).to_arrow_table()\n"
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "_duckdb.Error: Traceback (most recent call last):\n"
        '  File "/x/fsspec/spec.py", line 1310, in open\n'
        "    f = self._open(\n"
        "FileNotFoundError: The specified key does not exist: icepipe/wh/data/00001.parquet\n"
    )
    line = _spark_failure(text, LOG)
    assert line.startswith(
        "the Spark job failed: _duckdb.Error: FileNotFoundError: The specified key does not exist: "
        "icepipe/wh/data/00001.parquet; details in"
    ), line


def test_a_jvm_error_shows_its_first_line() -> None:
    line = _spark_failure("java.lang.IllegalStateException: boom\n\tat org.apache.X(X.java:1)\n", LOG)
    assert line.startswith("the Spark job failed: java.lang.IllegalStateException: boom; details in")
