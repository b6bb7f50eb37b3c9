"""Headwater errors raised inside Spark, carried to the driver whole.

Spark hands the driver only the *text* of an error raised in a Python worker (an executor
reading a partition, the planner process of the ``headwater_log`` source, ``foreachBatch``
called back from the JVM), wrapped in its own exceptions (``PythonException``,
``StreamingQueryException``, ``AnalysisException``) with JVM stacks around it. So the worker
side (:func:`carried_errors`, :func:`carried_iteration`) re-raises a :class:`HeadwaterError` as
:class:`CarriedError`, whose text starts with a marker holding the error as JSON (class, args,
attributes; base64, so no text of the error can look like a marker before it), and the driver
(:func:`unwrap`) finds the first marker in whatever Spark raised and rebuilds the error: the same
class, message and attributes, so the CLI prints its own one line and exits with its code.

Only subclasses of :class:`HeadwaterError` defined in Headwater's own packages are rebuilt, and
without calling their constructors (:func:`core.errors.restore_error`, as unpickling does): a marker
can name nothing else.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import importlib
import re
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

import orjson

from core.errors import HeadwaterError, one_line, restore_error

_MARK = "[headwater-error "
_FOUND = re.compile(re.escape(_MARK) + r"([A-Za-z0-9+/=]+)\]")
#: The packages whose errors a marker may name.
_OWN_PACKAGES = ("core", "log", "capture", "spark_log", "derived_feeds", "warehouse_loader", "operations")

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class CarriedError(Exception):
    """A Headwater error on its way out of a Spark Python worker (see the module docstring)."""

    @classmethod
    def of(cls, error: HeadwaterError) -> CarriedError:
        """The carrier of ``error``: its marker, then its one line for whoever reads spark.log."""
        kind = type(error)
        payload = {
            "class": f"{kind.__module__}:{kind.__qualname__}",
            "args": list(error.args),
            "state": dict(error.__dict__),
        }
        encoded = base64.b64encode(orjson.dumps(payload, default=str)).decode()
        return cls(f"{_MARK}{encoded}] {type(error).__name__}: {one_line(error)}")


def carried_errors(function: Callable[P, R]) -> Callable[P, R]:
    """``function`` with a :class:`HeadwaterError` it raises re-raised as :class:`CarriedError`."""

    @functools.wraps(function)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except HeadwaterError as exc:
            raise CarriedError.of(exc) from None

    return call


def carried_iteration(items: Iterator[T]) -> Iterator[T]:
    """``items`` with a :class:`HeadwaterError` raised while iterating re-raised as :class:`CarriedError`."""
    try:
        yield from items
    except HeadwaterError as exc:
        raise CarriedError.of(exc) from None


def unwrap(error: BaseException) -> HeadwaterError | None:
    """The Headwater error carried inside ``error`` (any Spark or py4j exception, and its causes), or None."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for text in _texts(current):
            found = _FOUND.search(text)
            if found is not None:
                rebuilt = _rebuild(found.group(1))
                if rebuilt is not None:
                    return rebuilt
        current = current.__cause__ or current.__context__
    return None


def _texts(error: BaseException) -> list[str]:
    texts = []
    with contextlib.suppress(Exception):  # a py4j error whose JVM is gone cannot render its text
        texts.append(str(error))
    for name in ("desc", "stackTrace"):  # pyspark's captured exceptions keep the JVM's text here
        value = getattr(error, name, None)
        if isinstance(value, str):
            texts.append(value)
    java = getattr(error, "java_exception", None)
    if java is not None:
        with contextlib.suppress(Exception):
            texts.append(str(java.toString()))
    return texts


def _rebuild(encoded: str) -> HeadwaterError | None:
    try:
        payload = orjson.loads(base64.b64decode(encoded, validate=True))
        module_name, _, qualname = str(payload["class"]).partition(":")
        args, state = payload["args"], payload["state"]
    except (binascii.Error, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    if module_name.split(".", 1)[0] not in _OWN_PACKAGES or not isinstance(args, list) or not isinstance(state, dict):
        return None
    try:
        kind: object = importlib.import_module(module_name)
        for part in qualname.split("."):
            kind = getattr(kind, part)
    except (ImportError, AttributeError):
        return None
    if not (isinstance(kind, type) and issubclass(kind, HeadwaterError)):
        return None
    return restore_error(kind, tuple(args), state)
