"""Row filters of MySQL sources (``sources.<name>.filters``), evaluated on binlog rows exactly as the server would.

PostgreSQL evaluates a source's row filters itself (publication row filters); MySQL has
nothing alike, so capture evaluates each condition on the rows it decodes, and the snapshots
put the same text in their ``WHERE`` (the server evaluates it there). Both must agree on every
row, so capture accepts only conditions it evaluates exactly as MySQL does and refuses every
other in one line, naming what to write instead:

* columns (bare or `` `quoted` ``, any case), integer and decimal literals, ``'text'`` (no
  backslashes: their meaning depends on ``sql_mode``), ``TRUE``, ``FALSE``, ``NULL``;
* ``+ - *``, ``%``/``MOD`` and ``DIV`` on numbers (MySQL's signs; ``x % 0`` is NULL);
* ``= <> != < <= > >= <=>``, ``IS [NOT] NULL``, ``[NOT] IN (...)``, ``[NOT] BETWEEN ... AND ...``,
  ``NOT``, ``AND``/``&&``, ``OR``, parentheses, with SQL's three-valued logic;
* numbers: integer columns (signed and unsigned, ``YEAR``, ``BIT(1)``), ``DECIMAL`` (unless
  ``decimal_handling_mode: double``) and ``FLOAT``/``DOUBLE`` (compared as doubles, as MySQL
  does when one side is one);
* text (``CHAR``/``VARCHAR``/``TEXT``/``ENUM``/``SET``) only by ``=``, ``<>``, ``<=>`` and
  ``IN`` with text literals, under a binary collation (``..._bin``; ``PAD SPACE`` ones ignore
  trailing spaces as the server does): a column of a linguistic collation (``..._ci``) is
  compared by rules only the server knows, so it is refused with the fix
  ``col COLLATE utf8mb4_bin = 'x'``;
* any column in ``IS [NOT] NULL``.

A row is captured when its condition is true (NULL and false leave it out). An arithmetic
result outside BIGINT's range (an error in MySQL) stops capture in one line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from capture.mysql.binlog.table_map import ColumnShape
from capture.mysql.filter_semantics import (
    Column,
    Eval,
    FilterOverflowError,
    Kind,
    Node,
    Row,
    RowFilterError,
    Text,
    arithmetic,
    collated,
    column,
    column_node,
    compare,
    constant,
    in_list,
    is_null,
    logic,
    minus,
    negation,
    numeric,
    truth,
)
from capture.mysql.types.values import TypeModes

__all__ = ["FilterOverflowError", "RowFilter", "RowFilterError", "compile_filter"]

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<number>\d+\.\d*|\.\d+|\d+)(?![A-Za-z_$])
    | (?P<string>'(?:[^']|'')*')
    | (?P<quoted>`(?:[^`]|``)+`)
    | (?P<word>[A-Za-z_$][A-Za-z0-9_$]*)
    | (?P<op><=>|<=|>=|<>|!=|&&|\|\||[=<>()+\-*%,/!])
    | (?P<other>\S)
    )""",
    re.VERBOSE,
)
_KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "IS", "NULL", "IN", "BETWEEN", "TRUE", "FALSE", "MOD", "DIV", "COLLATE", "XOR", "LIKE"}
)

# -- parsing ----------------------------------------------------------------------------------------------


@dataclass
class _Token:
    kind: str
    text: str


def _tokens(condition: str) -> list[_Token]:
    out: list[_Token] = []
    pos = 0
    text = condition.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:  # only trailing whitespace is left
            break
        pos = match.end()
        kind = match.lastgroup or "other"
        value = match.group(kind)
        if kind == "other" or (kind == "op" and value in ("||", "/", "!")):
            hint = {
                "||": "write OR",
                "/": "use DIV for whole numbers (/ gives a DECIMAL of the server's precision)",
                "!": "write NOT",
                '"': "write text in single quotes",
                ";": "a filter is one condition",
                "#": "comments are not allowed",
                "\\": "backslashes are not allowed",
            }.get(value, "")
            msg = f"{value!r} is not allowed in a filter" + (f": {hint}" if hint else "")
            raise RowFilterError(msg)
        if kind == "string" and "\\" in value:
            msg = "backslashes in text are not allowed in a filter (their meaning depends on the server's sql_mode)"
            raise RowFilterError(msg)
        if kind == "op" and value == "-" and pos < len(text) and text[pos] == "-":
            msg = "comments are not allowed in a filter"
            raise RowFilterError(msg)
        if kind == "word" and value.upper() in _KEYWORDS:
            out.append(_Token("keyword", value.upper()))
        else:
            out.append(_Token(kind, value))
    return out


class _Parser:
    """Recursive descent in MySQL's precedence: OR < AND < NOT < comparison < + - < * % DIV MOD < unary."""

    def __init__(self, tokens: list[_Token], columns: dict[str, Column]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.columns = columns
        #: Positions of the columns the condition reads.
        self.used: set[int] = set()

    # -- token helpers
    def peek(self, *texts: str) -> bool:
        return (
            self.pos < len(self.tokens)
            and self.tokens[self.pos].text in texts
            and self.tokens[self.pos].kind
            in (
                "keyword",
                "op",
            )
        )

    def take(self, *texts: str) -> str | None:
        if self.peek(*texts):
            self.pos += 1
            return self.tokens[self.pos - 1].text
        return None

    def expect(self, text: str) -> None:
        if self.take(text) is None:
            found = self.tokens[self.pos].text if self.pos < len(self.tokens) else "the end"
            msg = f"expected {text} but found {found!r}"
            raise RowFilterError(msg)

    # -- grammar
    def condition(self) -> Node:
        node = self.disjunction()
        if self.pos < len(self.tokens):
            token = self.tokens[self.pos]
            if token.text in ("XOR", "LIKE"):
                msg = f"{token.text} is not supported in a filter"
            else:
                msg = f"unexpected {token.text!r}"
            raise RowFilterError(msg)
        return node

    def disjunction(self) -> Node:
        node = self.conjunction()
        while self.take("OR"):
            node = logic("or", node, self.conjunction())
        return node

    def conjunction(self) -> Node:
        node = self.negation()
        while self.take("AND", "&&"):
            node = logic("and", node, self.negation())
        return node

    def negation(self) -> Node:
        if self.take("NOT"):
            return negation(self.negation())
        return self.comparison()

    def comparison(self) -> Node:
        left = self.additive()
        if self.take("IS"):
            negated = self.take("NOT") is not None
            self.expect("NULL")
            return is_null(left, negated)
        negated = self.take("NOT") is not None
        if self.take("IN"):
            self.expect("(")
            items = [self.additive()]
            while self.take(","):
                items.append(self.additive())
            self.expect(")")
            return in_list(left, items, negated)
        if self.take("BETWEEN"):
            low = self.additive()
            self.expect("AND")
            high = self.additive()
            node = logic("and", compare(">=", left, low), compare("<=", left, high))
            return negation(node) if negated else node
        if negated:
            msg = "NOT must be followed by IN or BETWEEN here"
            raise RowFilterError(msg)
        op = self.take("=", "<>", "!=", "<", "<=", ">", ">=", "<=>")
        if op is None:
            return left
        right = self.additive()
        if self.peek("=", "<>", "!=", "<", "<=", ">", ">=", "<=>"):
            msg = "chained comparisons (a < b < c) compare a truth value: write a < b AND b < c"
            raise RowFilterError(msg)
        return compare(op, left, right)

    def additive(self) -> Node:
        node = self.multiplicative()
        while (op := self.take("+", "-")) is not None:
            node = arithmetic(op, node, self.multiplicative())
        return node

    def multiplicative(self) -> Node:
        node = self.unary()
        while (op := self.take("*", "%", "MOD", "DIV")) is not None:
            node = arithmetic("%" if op == "MOD" else op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.take("-"):
            return minus(self.unary())
        if self.take("+"):
            inner = self.unary()
            numeric(inner, "+")
            return inner
        return self.primary()

    def primary(self) -> Node:
        if self.pos >= len(self.tokens):
            msg = "the condition ends too early"
            raise RowFilterError(msg)
        token = self.tokens[self.pos]
        self.pos += 1
        if token.kind == "op" and token.text == "(":
            node = self.disjunction()
            self.expect(")")
            return node
        if token.kind == "number":
            literal: Any = Decimal(token.text) if "." in token.text else int(token.text)
            return constant(Kind.NUMBER, literal)
        if token.kind == "string":
            return constant(Kind.TEXT, Text(token.text[1:-1].replace("''", "'"), None))
        if token.kind == "keyword" and token.text in ("TRUE", "FALSE"):
            return constant(Kind.NUMBER, int(token.text == "TRUE"))
        if token.kind == "keyword" and token.text == "NULL":
            return constant("null", None)
        if token.kind in ("word", "quoted"):
            name = token.text[1:-1].replace("``", "`") if token.kind == "quoted" else token.text
            if self.peek("("):
                msg = f"functions ({name}(...)) are not supported in a filter"
                raise RowFilterError(msg)
            column = self.columns.get(name.lower())
            if column is None:
                msg = f"there is no column {name!r}"
                raise RowFilterError(msg)
            self.used.add(column.index)
            node = column_node(column)
            if self.take("COLLATE"):
                node = self.collated(node, name)
            return node
        msg = f"unexpected {token.text!r}"
        raise RowFilterError(msg)

    def collated(self, node: Node, name: str) -> Node:
        if self.pos >= len(self.tokens) or self.tokens[self.pos].kind not in ("word", "quoted"):
            msg = "COLLATE needs a collation name"
            raise RowFilterError(msg)
        collation = self.tokens[self.pos].text.strip("`").lower()
        self.pos += 1
        if node.kind != Kind.TEXT:
            msg = f"COLLATE applies to text; {name!r} is not text"
            raise RowFilterError(msg)
        return collated(node, collation)


@dataclass
# -- the public side ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowFilter:
    """One table's condition, compiled for one table shape: :meth:`keeps` says whether a row is captured."""

    condition: str
    _eval: Eval
    #: Positions of the columns the condition reads (decoded even when not captured).
    columns: frozenset[int]

    def keeps(self, row: Row) -> bool:
        """True when the condition is true for ``row`` (values as decoded, in column order)."""
        return bool(self._eval(row))


def compile_filter(
    condition: str,
    columns: Sequence[ColumnShape],
    modes: TypeModes,
    collation_name: Callable[[int | None], str],
) -> RowFilter:
    """``condition`` compiled for a table of ``columns``; :class:`RowFilterError` if not evaluable exactly."""
    shapes = {c.name.lower(): column(i, c, modes, collation_name) for i, c in enumerate(columns)}
    tokens = _tokens(condition)
    if not tokens:
        msg = "the filter is empty"
        raise RowFilterError(msg)
    parser = _Parser(tokens, shapes)
    node = parser.condition()
    truth(node)
    return RowFilter(condition, node.eval, frozenset(parser.used))
