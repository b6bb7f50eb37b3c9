"""Spark's analyzed logical plans over py4j: walk them, rebuild parts of them, turn them back into DataFrames.

Feeds read the plan of their SQL to decide how it can be maintained (:mod:`derived_feeds.plan_class`)
and to run parts of it over a region of the state (:mod:`derived_feeds.maintained_view`). Every
object here is a py4j handle to a Catalyst node or expression; nothing is copied to Python.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: The hidden column each view of a maintained feed carries: its row's record key (``__hw_key_<view>``).
HIDDEN_PREFIX = "__hw_key_"
_ATTRIBUTE = "org.apache.spark.sql.catalyst.expressions.AttributeReference"


def seq(items: Any) -> list[Any]:
    """A Scala ``Seq`` (py4j) as a list."""
    return [items.apply(i) for i in range(items.size())]


def analyzed(frame: DataFrame) -> Any:
    """``frame``'s analyzed logical plan."""
    return frame._jdf.queryExecution().analyzed()


def is_attribute(expression: Any) -> bool:
    """Whether ``expression`` is a bare column reference."""
    return bool(expression.getClass().getName() == _ATTRIBUTE)


def hidden_view(name: str) -> str:
    """The view whose record key hidden column ``name`` is, or '' when it is not a hidden column."""
    return name.removeprefix(HIDDEN_PREFIX) if name.startswith(HIDDEN_PREFIX) else ""


def nodes(plan: Any) -> Iterator[Any]:
    """Every node of ``plan``, top down (pre-order), not below views (what a view reads is not the SQL's)."""
    todo = [plan]
    while todo:
        node = todo.pop()
        yield node
        if node.nodeName() != "View":
            todo.extend(reversed(seq(node.children())))


def expressions(node: Any) -> Iterator[Any]:
    """Every expression of ``node`` and their sub-expressions (pre-order)."""
    todo = seq(node.expressions())
    while todo:
        expression = todo.pop()
        yield expression
        todo.extend(seq(expression.children()))


class Catalyst:
    """The JVM entry points one session needs (each py4j name lookup is a round trip: looked up once)."""

    def __init__(self, spark: SparkSession) -> None:
        """Look up the classes of ``spark``'s JVM."""
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self.spark = spark
        self.to_seq: Callable[[list[Any]], Any] = jvm.org.apache.spark.api.python.PythonUtils.toSeq
        self._of_rows = jvm.org.apache.spark.sql.classic.Dataset.ofRows
        self._to_column = jvm.org.apache.spark.sql.classic.ExpressionUtils.column
        self._project = jvm.org.apache.spark.sql.catalyst.plans.logical.Project
        self.pattern = jvm.org.apache.spark.sql.catalyst.trees.TreePattern

    def frame(self, plan: Any) -> DataFrame:
        """``plan`` (analyzed) as a DataFrame of this session; Spark checks, optimizes and compiles it as usual."""
        from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

        return ClassicDataFrame(self._of_rows(self.spark._jsparkSession, plan), self.spark)

    def column(self, expression: Any) -> Column:
        """A resolved Catalyst expression as a Column (it keeps referring to its attributes by id)."""
        from pyspark.sql.classic.column import Column as ClassicColumn

        return ClassicColumn(self._to_column(expression))

    def rebuilt(self, chain: Sequence[Any], node: Any) -> Any:
        """``chain`` (nodes from the top down, each with one child) rebuilt over ``node``."""
        for parent in reversed(chain):
            node = parent.withNewChildren(self.to_seq([node]))
        return node

    def with_hidden(self, plan: Any) -> Any:
        """``plan`` with the views' hidden columns passed up to its output, where a projection dropped them.

        Projections get the hidden columns of their child appended; filters, joins, aliases and
        sorts pass them by themselves. Only row-by-row plans are rewritten (the caller stops at
        aggregates), so every output row keeps the keys of the rows it came from.
        """
        kind = plan.nodeName()
        if kind == "View":
            return plan
        children = [self.with_hidden(child) for child in seq(plan.children())]
        node = plan.withNewChildren(self.to_seq(children)) if children else plan
        if kind != "Project":
            return node
        listed = {a.exprId().id() for a in seq(node.projectList()) if is_attribute(a)}
        child_output = seq(node.child().output())
        missing = [a for a in child_output if hidden_view(a.name()) and a.exprId().id() not in listed]
        if not missing:
            return node
        return self._project(self.to_seq([*seq(node.projectList()), *missing]), node.child())
