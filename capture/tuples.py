"""A row as a source sends it: one value per column, text as the source prints it.

Every source kind hands capture its rows in this form (PostgreSQL: pgoutput's and COPY's text
format), so column policies, masks, quarantine and the event builders need no kind.
"""

from __future__ import annotations

from typing import Final, TypeAlias


class _UnchangedToast:
    """Type of :data:`UNCHANGED_TOAST`; a singleton, compared with ``is``."""

    __slots__ = ()
    _instance: _UnchangedToast | None = None

    def __new__(cls) -> _UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


#: A column whose value the source did not send because it did not change (PostgreSQL: an
#: unchanged TOASTed value), so it is unknown here. Never write it downstream as if it were data.
UNCHANGED_TOAST: Final = _UnchangedToast()


class NonUtf8Text(bytes):
    """A text value whose bytes are not UTF-8 (e.g. a PostgreSQL SQL_ASCII database stores any bytes).

    The type map refuses it, so its change goes to quarantine with these exact bytes.
    """


#: One column of a tuple: NULL, unchanged (not sent), a text value, or a binary value.
TupleValue: TypeAlias = _UnchangedToast | str | bytes | None
TupleData: TypeAlias = tuple[TupleValue, ...]
