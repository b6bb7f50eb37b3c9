"""Errors raised while registering, checking and capturing a PostgreSQL source.

Every message is one line that says what is wrong and what to do. A message never
holds a DSN password: it is built from the redacted DSN, and any text coming from
libpq (which may quote the connection string it failed to parse) passes through
:func:`scrub_secrets` first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from urllib.parse import unquote, urlsplit

from core.errors import HeadwaterError, PermanentError, TransientError
from core.source_config import redact_dsn

_KEYWORD_PASSWORD = re.compile(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")
# Userinfo runs to the last "@" before the path: passwords may hold ":" and "@".
_URL_PASSWORD = re.compile(r"://[^:/@]*:([^/]*)@")
_URL_USERINFO = re.compile(r"(://[^:/@]*:)[^/]*@")
_MASK = "***"


def dsn_secrets(dsn: str) -> list[str]:
    """Every spelling of the password(s) in ``dsn``, longest first (raw, percent-decoded, unquoted).

    Works on malformed DSNs too, since those are exactly the ones libpq quotes back.
    """
    found: set[str] = set()
    if "://" in dsn:
        # urlsplit parses userinfo leniently; a regex catches what it cannot (e.g. a bad port).
        try:
            password = urlsplit(dsn).password
        except ValueError:
            password = None
        candidates = [password] if password else []
        candidates += [m.group(1) for m in _URL_PASSWORD.finditer(dsn)]
        for raw in candidates:
            found.update({raw, unquote(raw)})
    for match in _KEYWORD_PASSWORD.finditer(dsn):
        value = match.group(1)
        found.add(value)
        if value.startswith("'") and value.endswith("'") and len(value) >= 2:
            inner = value[1:-1]
            found.update({inner, re.sub(r"\\(.)", r"\1", inner)})
    return sorted((s for s in found if s), key=len, reverse=True)


def scrub_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` as one line, with every secret replaced by ``***``."""
    for secret in secrets:
        text = text.replace(secret, _MASK)
    return " ".join(text.split())


def safe_dsn(dsn: str) -> str:
    """The DSN with its password masked; never raises, even for a malformed DSN."""
    try:
        redacted = redact_dsn(dsn)
    except ValueError:
        # e.g. a non-numeric port makes urlsplit().port raise: mask userinfo by hand.
        redacted = _URL_USERINFO.sub(r"\1***@", dsn)
    return scrub_secrets(redacted, dsn_secrets(dsn))


class CaptureError(HeadwaterError):
    """Base class of capture errors; context travels as attributes, not only in the text."""

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        table: str | None = None,
        slot: str | None = None,
        publication: str | None = None,
        lsn: str | None = None,
    ) -> None:
        super().__init__(message)
        self.source = source
        self.table = table
        self.slot = slot
        self.publication = publication
        self.lsn = lsn


class InvalidDsnError(CaptureError, PermanentError):
    """The DSN cannot be parsed."""


class AuthenticationError(CaptureError, PermanentError):
    """The server refused the login (wrong password, unknown role, no pg_hba.conf entry)."""


class SourceUnreachableError(CaptureError, TransientError):
    """No server answered at the DSN's host and port (down, wrong address, firewall)."""


class SourceDatabaseError(CaptureError, PermanentError):
    """The server answered but refused a statement we need (missing database, privilege, ...)."""


class PrerequisiteError(CaptureError, PermanentError):
    """The source fails one or more prerequisite checks; ``problems`` lists them all."""

    def __init__(self, message: str, *, source: str | None = None, problems: tuple[object, ...] = ()) -> None:
        super().__init__(message, source=source)
        self.problems = problems


class SlotError(CaptureError, PermanentError):
    """A replication slot cannot be created, used or dropped."""


class PublicationError(CaptureError, PermanentError):
    """A publication cannot be created, altered or dropped."""


class InvalidIdentifierError(CaptureError, PermanentError):
    """A table, schema, slot or publication name cannot be parsed or is not allowed."""


class SourceExistsError(CaptureError, PermanentError):
    """``source add`` was given a name the config already has."""


class UnknownSourceError(CaptureError, PermanentError):
    """The config has no source of that name."""


class ConfirmationRequiredError(CaptureError, PermanentError):
    """A destructive action needs confirmation and none can be asked for (no terminal, no ``--yes``)."""


class CancelledError(CaptureError, PermanentError):
    """The operator declined the confirmation; nothing was changed."""


class ConfiguredKeyError(CaptureError, PermanentError):
    """A key in ``sources.<name>.keys`` that capture cannot give every change of its table."""

    def __init__(self, source: str, table: str, problem: str) -> None:
        super().__init__(f"sources.{source}.keys.{table}: {problem}")
        self.source = source
        self.table = table


class KeyColumnExcludedError(CaptureError, PermanentError):
    """A key column left out by ``columns.exclude``/``include``: the records would lose their key."""

    def __init__(self, source: str, table: str, columns: Sequence[str], *, setting: str = "exclude") -> None:
        super().__init__(
            f"sources.{source}.columns.{setting}: {', '.join(f'{table}.{c}' for c in columns)} is part of the key "
            f"of {table} but not captured; capture it or give the table another key in sources.{source}.keys"
        )
        self.source = source
        self.table = table


class ColumnSettingError(CaptureError, PermanentError):
    """A ``sources.<name>`` setting that names a column or table capture cannot use as written."""

    def __init__(self, source: str, field: str, problem: str, *, table: str | None = None) -> None:
        super().__init__(f"sources.{source}.{field}: {problem}")
        self.source = source
        self.table = table


class SchemaChangeError(CaptureError, PermanentError):
    """A schema change capture cannot follow exactly: nothing after it was acknowledged; the message says what to do."""


class TypeMappingError(PermanentError):
    """A column value could not be converted; the record belongs in quarantine, not in the log."""

    def __init__(self, message: str, *, column: str | None = None, type_oid: int | None = None) -> None:
        where = f"column {column!r}: " if column else ""
        super().__init__(f"{where}{message}")
        self.column = column
        self.type_oid = type_oid


class UnrepresentableValueError(TypeMappingError):
    """The value exists in PostgreSQL but the configured mode cannot express it (NaN in ``precise``)."""


class BadRecordError(ValueError):
    """A change could not become an event (its record goes to quarantine instead)."""


class UnresolvedToastError(BadRecordError):
    """An unchanged TOASTed value could not be recovered (no previous image for the key)."""

    def __init__(self, topic: str, column: str) -> None:
        super().__init__(
            f"{topic}: column {column!r} is an unchanged TOAST value and no previous row image is known; "
            "set REPLICA IDENTITY FULL on the table or re-snapshot it"
        )
        self.topic = topic
        self.column = column


#: Errors that send one change to quarantine instead of stopping capture.
QUARANTINED_ERRORS = (TypeMappingError, BadRecordError)
