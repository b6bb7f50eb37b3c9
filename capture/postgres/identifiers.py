"""Table and schema names as PostgreSQL spells them, parsed once and always quoted in SQL.

Parsing follows PostgreSQL's rules for identifiers: an unquoted part is folded to
lower case and may hold only letters, digits, ``_`` and ``$``; a double-quoted part
is taken verbatim, with ``""`` standing for one ``"``. So ``Public.Customers`` means
``public.customers``, and ``"My Schema"."x.y"`` is the table ``x.y`` in ``My Schema``.

Names reach SQL only through :class:`psycopg.sql.Identifier`, never by string
formatting: a table named ``x"; drop table y; --`` is just an odd name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from psycopg import sql

from capture.errors import InvalidIdentifierError

_UNQUOTED = re.compile(r"^[^\W\d][\w$]*$")
# In a UTF-8 database PostgreSQL folds only ASCII letters of unquoted names.
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_NEEDS_NO_QUOTES = re.compile(r"^[a-z_][a-z0-9_$]*$")
#: PostgreSQL truncates longer identifiers (NAMEDATALEN - 1 bytes); we refuse them instead.
MAX_IDENTIFIER_BYTES = 63


def _split_outside_quotes(text: str, separator: str, what: str) -> list[str]:
    """Split ``text`` at ``separator`` where it is not inside double quotes."""
    parts: list[str] = []
    current: list[str] = []
    in_quotes = False
    for char in text:
        if char == '"':
            # A doubled quote inside quotes toggles twice, so it stays inside.
            in_quotes = not in_quotes
        if char == separator and not in_quotes:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if in_quotes:
        msg = f'{what} {text!r} has an unterminated double quote; close it or double it ("") inside a name'
        raise InvalidIdentifierError(msg)
    parts.append("".join(current))
    return parts


def _parse_part(part: str, text: str, what: str) -> str:
    stripped = part.strip()
    if not stripped:
        msg = f"{what} {text!r} has an empty name part"
        raise InvalidIdentifierError(msg)
    if len(stripped) >= 2 and stripped.startswith('"') and stripped.endswith('"'):
        inner = stripped[1:-1]
        if '"' in inner.replace('""', ""):
            msg = f'{what} {text!r}: a " inside a quoted name must be doubled ("")'
            raise InvalidIdentifierError(msg)
        name = inner.replace('""', '"')
    elif _UNQUOTED.match(stripped):
        name = stripped.translate(_ASCII_LOWER)
    else:
        msg = (
            f"{what} {text!r}: {stripped!r} is not a plain identifier; "
            f'wrap names with spaces, dots, dashes or capitals in double quotes, e.g. "My Schema"."My Table"'
        )
        raise InvalidIdentifierError(msg)
    if not name:
        msg = f"{what} {text!r} has an empty name part"
        raise InvalidIdentifierError(msg)
    if len(name.encode()) > MAX_IDENTIFIER_BYTES:
        msg = f"{what} {text!r}: {name[:20]!r}... is longer than PostgreSQL's {MAX_IDENTIFIER_BYTES}-byte limit"
        raise InvalidIdentifierError(msg)
    return name


def split_qualified(text: str, *, what: str = "name") -> list[str]:
    """The parts of a dotted name (``schema.table``, ``schema.table.column``), unquoted and case-folded."""
    return [_parse_part(part, text, what) for part in _split_outside_quotes(text, ".", what)]


def split_list(text: str, *, what: str = "list") -> list[str]:
    """Split a comma-separated list of names, keeping commas inside double quotes; blanks are dropped."""
    return [item.strip() for item in _split_outside_quotes(text, ",", what) if item.strip()]


def quote_part(name: str) -> str:
    """One identifier as text that :func:`split_qualified` reads back unchanged (quoted only when needed)."""
    if _NEEDS_NO_QUOTES.match(name):
        return name
    return '"' + name.replace('"', '""') + '"'


def parse_schema(text: str) -> str:
    """A schema name (one part)."""
    parts = split_qualified(text, what="schema")
    if len(parts) != 1:
        msg = f'schema {text!r} has {len(parts)} dotted parts; give one name, quoted if it holds a dot ("a.b")'
        raise InvalidIdentifierError(msg)
    return parts[0]


@dataclass(frozen=True, slots=True, order=True)
class TableName:
    """A schema-qualified table name; ``str()`` is its canonical text, ``identifier`` its SQL."""

    schema: str
    name: str

    @classmethod
    def parse(cls, text: str) -> TableName:
        """Parse ``schema.table`` (either part may be double-quoted); the schema is required."""
        parts = split_qualified(text, what="table")
        if len(parts) == 1:
            msg = f"table {text!r} needs its schema, e.g. public.{quote_part(parts[0])}"
            raise InvalidIdentifierError(msg, table=text)
        if len(parts) != 2:
            msg = (
                f"table {text!r} has {len(parts)} dotted parts; "
                'write schema.table and quote a name holding a dot ("x.y")'
            )
            raise InvalidIdentifierError(msg, table=text)
        return cls(parts[0], parts[1])

    @property
    def identifier(self) -> sql.Identifier:
        """The name for SQL text: ``"schema"."table"``, always quoted."""
        return sql.Identifier(self.schema, self.name)

    def __str__(self) -> str:
        return f"{quote_part(self.schema)}.{quote_part(self.name)}"


def parse_tables(items: list[str] | tuple[str, ...]) -> tuple[TableName, ...]:
    """Parse table names, rejecting duplicates (which Postgres would reject in a publication)."""
    tables = tuple(TableName.parse(item) for item in items)
    seen: set[TableName] = set()
    for table in tables:
        if table in seen:
            msg = f"table {table} is listed twice; list each table once"
            raise InvalidIdentifierError(msg, table=str(table))
        seen.add(table)
    return tables


def parse_schemas(items: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Parse schema names, rejecting duplicates."""
    schemas = tuple(parse_schema(item) for item in items)
    if len(set(schemas)) != len(schemas):
        msg = f"a schema is listed twice in {', '.join(items)}; list each schema once"
        raise InvalidIdentifierError(msg)
    return schemas
