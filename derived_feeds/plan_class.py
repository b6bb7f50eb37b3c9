"""Which kind of maintained view a feed's SQL is, decided once from Spark's analyzed plan, or why it is refused.

A feed's topic must equal its SQL over the current state of its source and lookups after
every micro-batch. That can be kept exactly, batch by batch, for these shapes (the plan
class, shown by ``headwater feeds run``):

* ``projection``: projections and filters over ``source`` whose key holds the source's key
  passed through; one Spark pass per micro-batch, each change with its own row
  (:class:`derived_feeds.transform.OnePass`). Decided by the feed job, which tries that pass.
* ``projection (maintained)``: the same SQL keyed by other output columns (or with ORDER BY).
* ``join``: ``source`` joined with lookups (INNER, CROSS, LEFT with ``source`` on the left,
  RIGHT with it on the right, LEFT SEMI), projections and filters over it.
* ``aggregate`` / ``aggregate over join``: one GROUP BY (or none: one row) over either of
  the above, with count, sum, avg, min, max (DISTINCT or not), count_if, bool_and/bool_or,
  HAVING and projections over the result.
* ``distinct``: SELECT DISTINCT over either of the above.

Everything else is refused when the feed is planned, in one line naming the construct and
what to write instead: non-deterministic functions (``rand``, ``uuid``, ``current_timestamp``
...), window functions, LIMIT/OFFSET/TABLESAMPLE, subqueries in expressions, UNION/EXCEPT/
INTERSECT, generators (explode), GROUPING SETS/ROLLUP/CUBE, an aggregate over an aggregate or
a join over one, FULL/ANTI joins or ``source`` on a join's null-supplying side, ``source``
read twice (self-joins), aggregates whose result depends on row order or is approximate.
ORDER BY is allowed and means nothing (a feed is a set of rows by key).

The key is checked, not assumed: :attr:`ViewShape.unique_by_plan` says whether the plan
itself makes it unique (the GROUP BY columns of an aggregate, every column of a DISTINCT,
the source's key passed through for row shapes); where it does not, the maintenance keeps
an index of the output keys and a duplicate stops the feed (``maintained_view``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from derived_feeds.catalyst import Catalyst, expressions, hidden_view, is_attribute, nodes, seq
from derived_feeds.errors import FeedConfigError
from derived_feeds.transform import SOURCE_VIEW


class PlanClass(StrEnum):
    """The shape of a feed's SQL, as maintained (module docstring)."""

    PROJECTION = "projection"
    REKEYED = "projection (maintained)"
    JOIN = "join"
    AGGREGATE = "aggregate"
    AGGREGATE_JOIN = "aggregate over join"
    DISTINCT = "distinct"


#: Aggregate functions whose value over a group's rows is a function of the rows alone (not of their order).
_AGGREGATES = frozenset({"Count", "Sum", "Average", "Min", "Max", "CountIf", "BoolAnd", "BoolOr"})
_ROW_NODES = frozenset({"Project", "Filter", "SubqueryAlias", "Sort"})
_GROUPING = frozenset({"Aggregate", "Distinct", "Deduplicate"})
_JOIN_SIDE = {"LeftOuter": 0, "LeftSemi": 0, "RightOuter": 1}
_NOT_MAINTAINED = {
    "Window": "a window function (OVER ...) is not maintained: its value depends on other rows in an order "
    "that changes with every batch; compute per-group values with GROUP BY in a feed of their own and join "
    "that feed as a lookup",
    "GlobalLimit": "LIMIT is not maintained: a feed holds every row its SQL gives; filter with WHERE instead",
    "LocalLimit": "LIMIT is not maintained: a feed holds every row its SQL gives; filter with WHERE instead",
    "Offset": "OFFSET is not maintained: a feed holds every row its SQL gives; filter with WHERE instead",
    "Tail": "a tail/LIMIT is not maintained: a feed holds every row its SQL gives; filter with WHERE instead",
    "Sample": "TABLESAMPLE is not maintained (not deterministic); filter with WHERE on a key expression instead",
    "Union": "UNION is not maintained; make each branch a feed of its own",
    "Except": "EXCEPT is not maintained; use a LEFT JOIN ... WHERE <lookup key> IS NULL",
    "Intersect": "INTERSECT is not maintained; use a JOIN",
    "Generate": "a generator (explode, LATERAL VIEW) is not maintained; keep arrays as columns",
    "Expand": "GROUPING SETS/ROLLUP/CUBE are not maintained; make one feed per grouping",
}


@dataclass(frozen=True, slots=True)
class ViewShape:
    """How a feed's SQL is maintained."""

    plan_class: PlanClass
    #: Maintained by groups (GROUP BY/DISTINCT: the groups a batch touches are recomputed) or by rows.
    grouped: bool
    #: The key is unique by the plan's construction; otherwise an index of output keys checks it.
    unique_by_plan: bool


def classify(
    catalyst: Catalyst, feed: str, plan: Any, key: Sequence[str], source_key: Sequence[str] | None
) -> ViewShape:
    """The shape of ``plan`` (the SQL analyzed over views with hidden key columns), or a :class:`FeedConfigError`.

    ``source_key``: the source topic's key columns (None when keyless or not the same in every
    schema version). Never :attr:`PlanClass.PROJECTION`: the feed job decides that one.
    """
    _refuse_expressions(catalyst, feed, plan)
    views: list[str] = []
    joins = 0
    grouping: list[Any] = []
    for node in nodes(plan):
        kind = node.nodeName()
        if kind in _NOT_MAINTAINED:
            raise FeedConfigError(feed, "sql", _NOT_MAINTAINED[kind])
        if kind == "View":
            views += [hidden_view(a.name()) for a in seq(node.output()) if hidden_view(a.name())]
        elif kind == "Join":
            joins += 1
            _check_join(feed, node)
        elif kind in _GROUPING:
            grouping.append(node)
        elif kind not in _ROW_NODES:
            raise FeedConfigError(
                feed, "sql", f"{kind} is not maintained; write the SQL as joins, filters and GROUP BY"
            )
    reads = views.count(SOURCE_VIEW)
    if reads != 1:
        msg = f"'{SOURCE_VIEW}' is read {reads} times (a self-join or a subquery over it), which is not maintained"
        raise FeedConfigError(feed, "sql", f"{msg}: read it once and join lookups to it")
    names = [a.name() for a in seq(plan.output()) if not hidden_view(a.name())]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise FeedConfigError(feed, "sql", f"output column {twice[0]!r} appears twice; give each column its own name")
    if not grouping:
        unique = _source_key_passed(plan, key, source_key)
        return ViewShape(PlanClass.JOIN if joins else PlanClass.REKEYED, grouped=False, unique_by_plan=unique)
    aggregate = _the_grouping(feed, plan, grouping)
    distinct = aggregate.nodeName() != "Aggregate"
    if not distinct:
        _check_aggregates(feed, aggregate)
    plan_class = PlanClass.DISTINCT if distinct else PlanClass.AGGREGATE_JOIN if joins else PlanClass.AGGREGATE
    return ViewShape(plan_class, grouped=True, unique_by_plan=_groups_keyed(plan, aggregate, key))


def top_chain(plan: Any) -> tuple[list[Any], Any]:
    """The nodes above the plan's GROUP BY/DISTINCT (top down), and that node."""
    chain = []
    node = plan
    while node.nodeName() not in _GROUPING:
        chain.append(node)
        node = node.child()
    return chain, node


def grouping_expressions(node: Any) -> list[Any]:
    """The expressions an Aggregate groups by; every column of a Distinct's child."""
    if node.nodeName() == "Aggregate":
        return seq(node.groupingExpressions())
    return seq(node.child().output())


def _refuse_expressions(catalyst: Catalyst, feed: str, plan: Any) -> None:
    current = catalyst.pattern.withName("CURRENT_LIKE")
    subquery = catalyst.pattern.withName("PLAN_EXPRESSION")
    for node in nodes(plan):
        for expression in expressions(node):
            children = seq(expression.children())
            if expression.containsPattern(subquery) and node.nodeName() != "View":
                msg = "a subquery in an expression (IN/EXISTS/scalar SELECT) is not maintained; join a lookup instead"
                raise FeedConfigError(feed, "sql", msg)
            own_current = expression.containsPattern(current) and not any(c.containsPattern(current) for c in children)
            own_random = not expression.deterministic() and all(c.deterministic() for c in children)
            if own_current or own_random:
                msg = (
                    f"{expression.prettyName()}() is not deterministic, so the feed could not equal its SQL over the "
                    "current rows; take the value from a column of the source table instead"
                )
                raise FeedConfigError(feed, "sql", msg)


def _check_join(feed: str, node: Any) -> None:
    kind = node.joinType().toString()
    if kind in ("Inner", "Cross"):
        return
    side = _JOIN_SIDE.get(kind)
    if side is None:
        what = {"FullOuter": "FULL JOIN", "LeftAnti": "an anti join (LEFT ANTI, NOT EXISTS, NOT IN)"}.get(kind, kind)
        msg = (
            f"{what} is not maintained; use LEFT JOIN with '{SOURCE_VIEW}' on the left (and WHERE <lookup key> IS NULL)"
        )
        raise FeedConfigError(feed, "sql", msg)
    children = seq(node.children())
    other = children[1 - side]
    if any(hidden_view(a.name()) == SOURCE_VIEW for a in seq(other.output())):
        msg = f"'{SOURCE_VIEW}' is on the side of a {node.joinType().sql()} JOIN that may lose rows, which is not "
        raise FeedConfigError(feed, "sql", msg + f"maintained; put '{SOURCE_VIEW}' on the kept side")


def _the_grouping(feed: str, plan: Any, grouping: list[Any]) -> Any:
    if len(grouping) > 1:
        msg = "an aggregate over an aggregate (GROUP BY or DISTINCT in a subquery) is not maintained; make the inner "
        raise FeedConfigError(feed, "sql", msg + "query a feed of its own and aggregate that feed")
    node = plan
    while node.nodeName() not in _GROUPING:
        if node.nodeName() not in _ROW_NODES:
            msg = "a join over a GROUP BY or DISTINCT result is not maintained; make the GROUP BY a feed of its own "
            raise FeedConfigError(feed, "sql", msg + "and join that feed as a lookup")
        node = node.child()
    return node


def _check_aggregates(feed: str, aggregate: Any) -> None:
    for expression in (e for a in seq(aggregate.aggregateExpressions()) for e in _tree(a)):
        if expression.getClass().getSimpleName() != "AggregateExpression":
            continue
        function = expression.aggregateFunction()
        if function.getClass().getSimpleName() not in _AGGREGATES:
            msg = (
                f"aggregate {function.prettyName()}() is not maintained (its value depends on the order of rows or is "
                "approximate); use count, sum, avg, min, max (DISTINCT or not), count_if, bool_and or bool_or"
            )
            raise FeedConfigError(feed, "sql", msg)


def _tree(expression: Any) -> list[Any]:
    found, todo = [], [expression]
    while todo:
        item = todo.pop()
        found.append(item)
        todo.extend(seq(item.children()))
    return found


def _output_names(plan: Any) -> dict[int, str]:
    return {a.exprId().id(): a.name() for a in seq(plan.output())}


def _source_key_passed(plan: Any, key: Sequence[str], source_key: Sequence[str] | None) -> bool:
    """Whether every source key column reaches the output unchanged under a name of the feed key."""
    if not source_key:
        return False
    source = next(n for n in nodes(plan) if n.nodeName() == "View" and _is_source(n))
    ids = {a.name(): a.exprId().id() for a in seq(source.output())}
    output = _output_names(plan)
    return all(column in ids and output.get(ids[column]) in key for column in source_key)


def _is_source(view: Any) -> bool:
    return any(hidden_view(a.name()) == SOURCE_VIEW for a in seq(view.output()))


def _groups_keyed(plan: Any, grouping: Any, key: Sequence[str]) -> bool:
    """Whether every grouping expression reaches the output, as a column the feed key names."""
    output = _output_names(plan)
    produced: dict[int, Any] = {}
    if grouping.nodeName() == "Aggregate":
        for expression in seq(grouping.aggregateExpressions()):
            produced[expression.exprId().id()] = expression.child() if not is_attribute(expression) else expression
    for expression in grouping_expressions(grouping):
        ids = [i for i, made in produced.items() if made.semanticEquals(expression)]
        if is_attribute(expression):
            ids.append(expression.exprId().id())
        if not any(output.get(i) in key for i in ids):
            return False
    return True
