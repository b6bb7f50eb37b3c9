import pytest
from psycopg import sql

from capture.errors import InvalidIdentifierError
from capture.postgres.identifiers import (
    TableName,
    parse_schema,
    parse_schemas,
    parse_tables,
    quote_part,
    split_list,
    split_qualified,
)

EVIL = 'x"; drop table y; --'


@pytest.mark.parametrize(
    ("text", "schema", "name"),
    [
        ("public.customers", "public", "customers"),
        ("Public.Customers", "public", "customers"),  # unquoted names fold to lower case
        ('"My Schema"."x.y"', "My Schema", "x.y"),
        ('"Public"."Customers"', "Public", "Customers"),
        (' public . "a b" ', "public", "a b"),
        ('public."x""; drop table y; --"', "public", EVIL),
        ("s.t$1", "s", "t$1"),
        ("ünï.cödé", "ünï", "cödé"),
        ('"".""""', None, None),
    ],
)
def test_parse(text, schema, name):
    if schema is None:
        with pytest.raises(InvalidIdentifierError):
            TableName.parse(text)
        return
    table = TableName.parse(text)
    assert (table.schema, table.name) == (schema, name)


def test_round_trip_through_canonical_text():
    for schema, name in [("public", "customers"), ("My Schema", "x.y"), ("public", EVIL), ("a", 'q"'), ("S", "T")]:
        table = TableName(schema, name)
        assert TableName.parse(str(table)) == table


def test_canonical_text_quotes_only_when_needed():
    assert str(TableName("public", "customers")) == "public.customers"
    assert str(TableName("public", "Customers")) == 'public."Customers"'
    assert str(TableName("public", EVIL)) == 'public."x""; drop table y; --"'
    assert quote_part("1abc") == '"1abc"'


def test_identifier_is_always_quoted():
    ident = TableName("public", EVIL).identifier
    assert isinstance(ident, sql.Identifier)
    assert ident.as_string(None) == '"public"."x""; drop table y; --"'


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("customers", "needs its schema, e.g. public.customers"),
        ("a.b.c", "3 dotted parts"),
        ('public."unterminated', "unterminated double quote"),
        ("public.my-table", "not a plain identifier"),
        ("public.", "empty name part"),
        ('public."a"b', "not a plain identifier"),
        ("public." + "x" * 64, "63-byte limit"),
        ('public."a"b"', 'double it ("")'),
    ],
)
def test_parse_errors_say_what_to_do(text, fragment):
    with pytest.raises(InvalidIdentifierError) as caught:
        TableName.parse(text)
    assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)


def test_split_list_keeps_commas_and_dots_inside_quotes():
    assert split_list('public.a, "s,1"."t,2" ,,public."x""; drop table y; --"') == [
        "public.a",
        '"s,1"."t,2"',
        'public."x""; drop table y; --"',
    ]
    assert [TableName.parse(t) for t in split_list('"s,1"."t,2"')] == [TableName("s,1", "t,2")]


def test_split_qualified_handles_columns():
    assert split_qualified('public.customers."SSN"') == ["public", "customers", "SSN"]


def test_schemas():
    assert parse_schema('"My Schema"') == "My Schema"
    assert parse_schemas(["public", "Sales"]) == ("public", "sales")
    with pytest.raises(InvalidIdentifierError, match="one name"):
        parse_schema("a.b")
    with pytest.raises(InvalidIdentifierError, match="listed twice"):
        parse_schemas(["public", "PUBLIC"])


def test_duplicate_tables_rejected():
    with pytest.raises(InvalidIdentifierError, match="listed twice"):
        parse_tables(["public.a", "PUBLIC.A"])


def test_tables_order():
    assert sorted([TableName("b", "a"), TableName("a", "b")]) == [TableName("a", "b"), TableName("b", "a")]
