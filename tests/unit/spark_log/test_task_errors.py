"""Headwater errors carried out of Spark's Python workers as text and rebuilt whole on the driver."""

from __future__ import annotations

import base64

import orjson
import pytest

from core.errors import EXIT_PERMANENT, HeadwaterError, PermanentError, TransientError
from log.errors import CorruptLogError, LogUnavailableError, UnknownTopicError
from spark_log.errors import UndecodableValueError
from spark_log.task_errors import CarriedError, carried_errors, carried_iteration, unwrap


def spark_text(carrier: CarriedError) -> str:
    """What the driver sees: the worker's traceback inside Spark's and the JVM's own text."""
    return (
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Job aborted due to stage failure: "
        "Task 0 in stage 3.0 failed 1 times, most recent failure: Lost task 0.0 (TID 7) (127.0.0.1 executor driver): "
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/pyspark/worker.py", line 1, in main\n'
        f"spark_log.task_errors.CarriedError: {carrier}\n"
        "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:1)\n"
    )


@pytest.mark.parametrize(
    "error",
    [
        CorruptLogError("/log/t/0/00000000000000000000.log", 12, "damaged batch in a closed segment"),
        UnknownTopicError("shop.public.items"),
        UndecodableValueError(
            topic="t", partition=0, offset=5, column="n", value="seven", expected="int", reason="not a number"
        ),
        LogUnavailableError("broker down; retrying"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_error_comes_back_whole_from_spark_text(error: HeadwaterError) -> None:
    rebuilt = unwrap(RuntimeError(spark_text(CarriedError.of(error))))
    assert type(rebuilt) is type(error)
    assert str(rebuilt) == str(error)
    assert rebuilt.__dict__ == {k: v for k, v in error.__dict__.items()}
    assert isinstance(rebuilt, PermanentError) == isinstance(error, PermanentError)  # the CLI's exit code
    assert isinstance(rebuilt, TransientError) == isinstance(error, TransientError)


def test_the_carrier_reads_as_the_error_in_spark_log() -> None:
    carrier = CarriedError.of(UnknownTopicError("shop.public.items"))
    assert "UnknownTopicError: " in str(carrier)
    assert str(UnknownTopicError("shop.public.items")) in str(carrier)
    assert EXIT_PERMANENT == 3


def test_the_error_is_found_in_a_cause_and_the_first_marker_wins() -> None:
    first = CarriedError.of(UnknownTopicError("first"))
    second = CarriedError.of(UnknownTopicError("second"))
    try:
        try:
            raise RuntimeError(spark_text(first) + spark_text(second))
        except RuntimeError as inner:
            raise ValueError("py4j: An error occurred while calling o12.awaitTermination") from inner
    except ValueError as outer:
        rebuilt = unwrap(outer)
    assert isinstance(rebuilt, UnknownTopicError)
    assert "'first'" in str(rebuilt)


def marker(payload: object) -> str:
    return "[headwater-error " + base64.b64encode(orjson.dumps(payload)).decode() + "]"


@pytest.mark.parametrize(
    "payload",
    [
        {"class": "os:system", "args": ["echo pwned"], "state": {}},
        {"class": "builtins:ValueError", "args": ["x"], "state": {}},
        {"class": "core.config:load_config", "args": ["x"], "state": {}},
        {"class": "log.errors:NoSuchError", "args": ["x"], "state": {}},
        {"class": "log.errors:UnknownTopicError", "args": "not a list", "state": {}},
        "not an object",
    ],
)
def test_a_marker_naming_anything_but_a_headwater_error_is_ignored(payload: object) -> None:
    assert unwrap(RuntimeError(f"text {marker(payload)} more")) is None


def test_text_without_a_marker_or_with_a_damaged_one_gives_nothing() -> None:
    assert unwrap(RuntimeError("the Spark job failed: java.lang.OutOfMemoryError")) is None
    assert unwrap(RuntimeError("[headwater-error %%%notbase64] x")) is None
    assert unwrap(RuntimeError("[headwater-error aGVsbG8=] x")) is None


def test_workers_raise_the_carrier_from_functions_and_iterations() -> None:
    @carried_errors
    def plan() -> None:
        raise UnknownTopicError("t")

    with pytest.raises(CarriedError) as raised:
        plan()
    assert isinstance(unwrap(raised.value), UnknownTopicError)

    def rows():
        yield 1
        raise CorruptLogError("/s.log", 0, "damaged")

    items = carried_iteration(rows())
    assert next(items) == 1
    with pytest.raises(CarriedError) as raised:
        next(items)
    assert isinstance(unwrap(raised.value), CorruptLogError)
    with pytest.raises(ValueError, match="not a Headwater error"):
        list(carried_iteration(iter_raising(ValueError("not a Headwater error"))))


def iter_raising(error: Exception):
    yield from ()
    raise error
