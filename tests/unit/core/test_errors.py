"""Every Headwater error class survives pickling (Spark workers and child processes send them back whole)."""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import pathlib
import pickle
import pkgutil
import types
import typing

import pytest

from core.errors import HeadwaterError

PACKAGES = ["core", "log", "capture", "spark_log", "derived_feeds", "warehouse_loader", "operations", "dagster_project"]


def _error_classes() -> list[type[HeadwaterError]]:
    found: dict[str, type[HeadwaterError]] = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            module = importlib.import_module(info.name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, HeadwaterError) and cls.__module__ == module.__name__:
                    found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[name] for name in sorted(found)]


def _value(hint: object) -> object:
    """A sample argument of type ``hint`` (the constructors' annotations say what they take)."""
    origin = typing.get_origin(hint) or hint
    if origin in (typing.Union, types.UnionType):
        return _value(next(a for a in typing.get_args(hint) if a is not type(None)))
    if origin is int:
        return 7
    if origin is float:
        return 1.5
    if origin is bool:
        return True
    if origin in (list, tuple, collections.abc.Sequence, collections.abc.Iterable, set, frozenset):
        return ["a", "b"]
    if origin in (dict, collections.abc.Mapping):
        return {"a": "b"}
    if origin is pathlib.Path:
        return pathlib.Path("/x")
    return "sample"


def _instance(cls: type[HeadwaterError]) -> HeadwaterError:
    """An instance built through the class's own constructor, with a value for every required parameter."""
    hints = typing.get_type_hints(cls.__init__)
    args, kwargs = [], {}
    for name, parameter in list(inspect.signature(cls.__init__).parameters.items())[1:]:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            args.append("detail")
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD or parameter.default is not inspect.Parameter.empty:
            continue
        elif parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[name] = _value(hints.get(name, str))
        else:
            args.append(_value(hints.get(name, str)))
    return cls(*args, **kwargs)


CLASSES = _error_classes()


def test_every_error_class_is_found() -> None:
    assert len(CLASSES) > 40


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_pickles_whole(cls: type[HeadwaterError]) -> None:
    error = _instance(cls)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error)
    assert copy.__dict__ == error.__dict__
