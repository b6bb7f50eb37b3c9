"""Feed expectations (Databricks pipeline expectations over Great Expectations names) as Spark predicates.

Each supported row-level GX expectation becomes a boolean Column on the feed's output
row (``after``): true when the row meets it. As in GX, a null value counts as meeting
every expectation except ``expect_column_values_to_not_be_null`` (GX leaves nulls out of
the other column-map expectations). Deletes have no row and always pass.

Actions: ``warn`` keeps the row and counts it; ``drop`` sends it to ``<feed>.quarantine``
(headers ``headwater.expectation`` and ``headwater.error``) and takes its key out of the
feed; ``fail`` stops the feed before the batch is written. ``mostly`` (GX) is honoured by
``warn``/``fail``: the batch fails only when the passing share is below it.
An unknown expectation, argument or column is a config error at start, before any batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from core.config import ExpectationConfig
from derived_feeds.errors import FeedConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column

Action = Literal["warn", "drop", "fail"]
#: Header naming the expectation a quarantined row failed.
EXPECTATION_HEADER = "headwater.expectation"

Predicate = Callable[["Column", Mapping[str, Any]], "Column"]


def _between(value: Column, args: Mapping[str, Any]) -> Column:
    low, high = args.get("min_value"), args.get("max_value")
    ok = F.lit(True)
    if low is not None:
        ok = ok & (value > F.lit(low) if args.get("strict_min") else value >= F.lit(low))
    if high is not None:
        ok = ok & (value < F.lit(high) if args.get("strict_max") else value <= F.lit(high))
    return ok


def _lengths_between(value: Column, args: Mapping[str, Any]) -> Column:
    return _between(F.length(value), args)


def _length_equal(value: Column, args: Mapping[str, Any]) -> Column:
    return F.length(value) == F.lit(args["value"])


def _regex(value: Column, args: Mapping[str, Any]) -> Column:
    return value.cast("string").rlike(str(args["regex"]))  # GX: re.search semantics; rlike finds too


def _not_regex(value: Column, args: Mapping[str, Any]) -> Column:
    return ~value.cast("string").rlike(str(args["regex"]))


def _in_set(value: Column, args: Mapping[str, Any]) -> Column:
    return value.isin(*list(args["value_set"]))


def _not_in_set(value: Column, args: Mapping[str, Any]) -> Column:
    return ~value.isin(*list(args["value_set"]))


@dataclass(frozen=True, slots=True)
class _Rule:
    predicate: Predicate
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    nulls_pass: bool = True


_COMMON = ("mostly", "meta", "notes", "result_format", "catch_exceptions", "description")
_BETWEEN = ("min_value", "max_value", "strict_min", "strict_max")

#: The row-level expectations a feed can evaluate (GX 1.x names), each needing ``column``.
RULES: Mapping[str, _Rule] = {
    "expect_column_values_to_not_be_null": _Rule(lambda v, a: v.isNotNull(), nulls_pass=False),
    "expect_column_values_to_be_null": _Rule(lambda v, a: v.isNull(), nulls_pass=False),
    "expect_column_values_to_be_between": _Rule(_between, optional=_BETWEEN),
    "expect_column_values_to_match_regex": _Rule(_regex, required=("regex",)),
    "expect_column_values_to_not_match_regex": _Rule(_not_regex, required=("regex",)),
    "expect_column_values_to_be_in_set": _Rule(_in_set, required=("value_set",)),
    "expect_column_values_to_not_be_in_set": _Rule(_not_in_set, required=("value_set",)),
    "expect_column_value_lengths_to_be_between": _Rule(_lengths_between, optional=("min_value", "max_value")),
    "expect_column_value_lengths_to_equal": _Rule(_length_equal, required=("value",)),
}


@dataclass(frozen=True, slots=True)
class Check:
    """One compiled expectation of a feed."""

    index: int
    expectation: str
    column: str
    action: Action
    args: Mapping[str, Any] = field(default_factory=dict)
    mostly: float = 1.0

    @property
    def flag(self) -> str:
        """The boolean result column this check adds (true: the row meets the expectation)."""
        return f"__hw_ok{self.index}"

    def describe(self) -> str:
        """``expect_...(column=..., args)`` for reasons and reports."""
        shown = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"{self.expectation}(column={self.column!r}{', ' + shown if shown else ''})"

    def predicate(self, row: Column) -> Column:
        """True where ``row`` (the ``after`` STRUCT) meets the expectation; deletes (null row) pass."""
        rule = RULES[self.expectation]
        value = row[self.column]
        ok = rule.predicate(value, self.args)
        if rule.nulls_pass:
            ok = value.isNull() | ok
        return row.isNull() | F.coalesce(ok, F.lit(False))


def checked_rule(
    feed: str, where: str, expectation: ExpectationConfig, *, name_field: str | None = None
) -> tuple[_Rule, Action]:
    """The rule and action of the feed expectation at ``where``; a one-line config error if either is missing.

    An unknown expectation name is reported at ``name_field`` (default ``where``).
    """
    rule = RULES.get(expectation.expect)
    if rule is None:
        supported = ", ".join(sorted(RULES))
        msg = f"{expectation.expect} is not a row-level expectation a feed can evaluate; use one of {supported}"
        raise FeedConfigError(feed, name_field or where, msg)
    if expectation.action is None:
        raise FeedConfigError(feed, f"{where}.action", "give action: warn, drop or fail")
    return rule, expectation.action


def compile_checks(feed: str, expectations: Sequence[ExpectationConfig], output: StructType) -> list[Check]:
    """Validate a feed's expectations against its output columns; a one-line config error otherwise."""
    checks = []
    for index, expectation in enumerate(expectations):
        where = f"expectations[{index}]"
        rule, action = checked_rule(feed, where, expectation)
        args = expectation.kwargs
        column = args.pop("column", None)
        if not isinstance(column, str):
            raise FeedConfigError(feed, f"{where}.column", f"{expectation.expect} needs 'column'")
        if column not in output.fieldNames():
            known = ", ".join(output.fieldNames())
            raise FeedConfigError(feed, f"{where}.column", f"{column!r} is not an output column (columns: {known})")
        missing = [name for name in rule.required if name not in args]
        if missing:
            raise FeedConfigError(feed, f"{where}.{missing[0]}", f"{expectation.expect} needs {missing[0]!r}")
        unknown = [name for name in args if name not in (*rule.required, *rule.optional, *_COMMON)]
        if unknown:
            raise FeedConfigError(feed, f"{where}.{unknown[0]}", f"unknown argument of {expectation.expect}")
        mostly = float(args.pop("mostly", 1.0))
        for name in _COMMON:
            args.pop(name, None)
        checks.append(Check(index, expectation.expect, column, action, args, mostly))
    return checks


def with_checks(changes: Any, checks: Sequence[Check], row: str = "after") -> Any:
    """``changes`` plus one boolean column per check (:attr:`Check.flag`)."""
    if not checks:
        return changes
    return changes.withColumns({check.flag: check.predicate(F.col(row)) for check in checks})
