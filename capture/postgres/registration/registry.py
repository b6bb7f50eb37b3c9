"""Registering a source: check the database, create its publication and slot, record it in ``headwater.yaml``.

Order matters for what a failure leaves behind. ``add_source`` validates the new
config before touching the database, creates the publication before the slot (a
pgoutput slot decodes with the catalogs as of each change, so the publication must
predate the slot's start), and writes the config last; if a later step fails, the
objects it created are dropped again. ``remove_source`` drops the database objects
first and edits the config only when that worked, so a source is never forgotten
while its slot still retains WAL.

The config is edited in place, checked as it will be read and replaced atomically
(:mod:`capture.config_document`).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.tokens import CommentToken

from capture import config_document
from capture.errors import (
    AuthenticationError,
    CancelledError,
    CaptureError,
    InvalidDsnError,
    PrerequisiteError,
    SourceDatabaseError,
    SourceExistsError,
    SourceUnreachableError,
    UnknownSourceError,
    dsn_secrets,
    safe_dsn,
    scrub_secrets,
)
from capture.postgres.identifiers import parse_schemas, parse_tables, quote_part
from capture.postgres.registration import publication as pub
from capture.postgres.registration import slot as slots
from capture.postgres.registration.prerequisites import CaptureRequest, Problem, check_source, fatal
from capture.postgres.registration.publication import PublicationInfo
from capture.postgres.registration.slot import SlotStatus
from core.config import ProjectConfig
from core.errors import ConfigError
from core.source_config import SourceConfig
from log.sequence import Lsn

_ENV_REF = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$")
_CONNECT_TIMEOUT_S = 10
_AUTH_FAILURES = ("password authentication failed", "no pg_hba.conf entry", 'role "', "authentication")
#: libpq's messages when TLS is required but impossible, or its certificates/keys are wrong.
_SSL_FAILURE = re.compile(r"\bssl\b|sslmode|certificate|\btls\b", re.IGNORECASE)

SnapshotMode = Literal["initial", "never", "when_needed", "initial_only"]


# -- connections --------------------------------------------------------------------------------


def connect(dsn: str, *, source: str | None = None) -> psycopg.Connection[Any]:
    """An autocommit connection to the source; failures become one-line errors without the password."""
    secrets = dsn_secrets(dsn)
    shown = safe_dsn(dsn)
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        detail = scrub_secrets(str(exc), secrets)
        msg = (
            f"invalid DSN {shown}: {detail}; write it as postgresql://user:${{PASSWORD_VAR}}@host:5432/dbname "
            "or 'host=... port=... dbname=... user=...'"
        )
        raise InvalidDsnError(msg, source=source) from None
    extra: dict[str, Any] = {}
    if "connect_timeout" not in params:
        extra["connect_timeout"] = _CONNECT_TIMEOUT_S
    if "application_name" not in params:
        extra["application_name"] = "headwater"
    try:
        return psycopg.connect(dsn, autocommit=True, **extra)
    except psycopg.Error as exc:
        # libpq appends a multi-line hint ("Is the server running ..."); our message says what to do.
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        detail = scrub_secrets(first_line.removeprefix("connection failed: "), secrets)
        lowered = detail.lower()
        if isinstance(exc, psycopg.ProgrammingError) or "connection option" in lowered:
            msg = f"invalid DSN {shown}: {detail}; fix the connection string"
            raise InvalidDsnError(msg, source=source) from None
        if any(marker in lowered for marker in _AUTH_FAILURES) and "does not exist" not in lowered:
            msg = (
                f"cannot log in to {shown}: {detail}; check the user and password (or the environment "
                "variable it comes from) and the server's pg_hba.conf"
            )
            raise AuthenticationError(msg, source=source) from None
        if _SSL_FAILURE.search(detail):
            # The DSN's ssl* settings reached libpq unchanged; say which mode was asked for.
            mode = params.get("sslmode") or os.environ.get("PGSSLMODE") or "prefer"
            msg = (
                f"cannot open a connection with sslmode={mode} to {shown}: {detail}; enable SSL on the server, or "
                "fix sslmode / sslrootcert / sslcert / sslkey in the DSN (sslmode=disable only on a trusted network)"
            )
            raise SourceDatabaseError(msg, source=source) from None
        if "does not exist" in lowered:
            msg = f"cannot connect to {shown}: {detail}; fix the DSN or create it on the server"
            raise SourceDatabaseError(msg, source=source) from None
        host = params.get("host") or params.get("hostaddr") or "localhost"
        port = params.get("port") or "5432"
        msg = (
            f"cannot reach PostgreSQL at {host}:{port} ({shown}): {detail}; check the host and port, that the "
            "server is running and listening there (listen_addresses) and that no firewall blocks it"
        )
        raise SourceUnreachableError(msg, source=source) from None


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Registration:
    """What ``add_source`` did."""

    name: str
    config_path: Path
    slot: str
    publication: str
    #: ``created`` / ``altered`` (Headwater's own, re-targeted) / ``reused`` (pre-created, e.g. by an admin).
    publication_action: Literal["created", "altered", "reused"]
    #: The slot's consistent point: changes committed after it will be captured.
    consistent_lsn: Lsn
    warnings: tuple[str, ...] = ()
    #: What the operator should know (not a problem): e.g. what a failover needs before PostgreSQL 17.
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Removal:
    """What ``remove_source`` did; ``notes`` say what was left in place and why."""

    name: str
    slot: str
    publication: str
    slot_dropped: bool
    publication_dropped: bool
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SourceView:
    """A registered source as configured, with its live slot and publication (DSN password masked)."""

    name: str
    dsn: str
    tables: tuple[str, ...] | None
    schemas: tuple[str, ...] | None
    snapshot: str
    slot: str
    publication: str
    slot_status: SlotStatus | None = None
    publication_info: PublicationInfo | None = None
    #: Why the live state is unknown (unreachable server, ...); None when it was read.
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "dsn": self.dsn,
            "tables": list(self.tables) if self.tables is not None else None,
            "schemas": list(self.schemas) if self.schemas is not None else None,
            "snapshot": self.snapshot,
            "slot": self.slot,
            "publication": self.publication,
            "slot_status": self.slot_status.as_dict() if self.slot_status is not None else None,
            "publication_status": self.publication_info.as_dict() if self.publication_info is not None else None,
            "error": self.error,
        }


def object_names(name: str, source: SourceConfig) -> tuple[str, str]:
    """The slot and publication a configured source uses: its own settings, else the defaults."""
    return (source.slot or slots.default_slot_name(name), source.publication or pub.default_publication_name(name))


def _request(name: str, source: SourceConfig) -> CaptureRequest:
    slot, publication = object_names(name, source)
    return CaptureRequest(
        source=name,
        slot=slot,
        publication=publication,
        tables=parse_tables(source.tables) if source.tables is not None else None,
        schemas=parse_schemas(source.schemas) if source.schemas is not None else None,
    )


def _literal_password_warning(dsn: str) -> str | None:
    if all(_ENV_REF.match(secret) for secret in dsn_secrets(dsn)):
        return None
    return (
        "the DSN holds a literal password, now stored in plain text in headwater.yaml; prefer an environment "
        "variable: --dsn 'postgresql://user:${SHOP_PW}@host:5432/db' and export SHOP_PW"
    )


def _problems_line(problems: Sequence[Problem], source: str) -> str:
    if len(problems) == 1:
        return problems[0].message
    numbered = "; ".join(f"({i}) {p.message}" for i, p in enumerate(problems, 1))
    return f"source {source} fails {len(problems)} prerequisite checks: {numbered}"


def plan_text(request: CaptureRequest, action: str, shown_dsn: str) -> str:
    """The confirmation question for ``add``: what will be created where."""
    targets = (
        ", ".join(str(t) for t in request.tables)
        if request.tables is not None
        else "schemas " + ", ".join(quote_part(s) for s in request.schemas or ())
    )
    verb = {"created": "create", "altered": "alter", "reused": "use existing"}[action]
    return (
        f"{verb} publication {request.publication} ({targets}) and create replication slot {request.slot} "
        f"on {shown_dsn}? The slot retains WAL until 'headwater capture' consumes it"
    )


# -- operations ---------------------------------------------------------------------------------


def add_source(
    config_path: Path,
    name: str,
    dsn: str,
    *,
    tables: Sequence[str] | None = None,
    schemas: Sequence[str] | None = None,
    snapshot: SnapshotMode = "initial",
    slot: str | None = None,
    publication: str | None = None,
    confirm: Callable[[str], bool] | None = None,
) -> Registration:
    """Check the database, create publication and slot, and add source ``name`` to the config file.

    ``tables`` / ``schemas`` are names as the user wrote them (``schema.table``,
    double-quoted where needed); exactly one must be given. ``dsn`` is stored as given
    (``${VAR}`` references stay references). ``confirm`` is asked after every check
    passed and before anything is created; declining raises :class:`CancelledError`.
    """
    config_path = Path(config_path)
    document = config_document.read_document(config_path)
    current = config_document.validate(config_document.render(document), config_path)
    if name in current.sources:
        msg = (
            f"source {name} is already registered in {config_path}; pick another name, "
            f"or remove it first: headwater source remove {name}"
        )
        raise SourceExistsError(msg, source=name)
    if (tables is None) == (schemas is None):
        msg = "give exactly one of --tables or --schemas"
        raise CaptureError(msg, source=name)
    parsed_tables = parse_tables(tuple(tables)) if tables is not None else None
    parsed_schemas = parse_schemas(tuple(schemas)) if schemas is not None else None
    if not (parsed_tables or parsed_schemas):
        msg = "--tables or --schemas lists no name; give at least one, e.g. --tables public.customers"
        raise CaptureError(msg, source=name)
    slot_name = slots.validate_slot_name(slot) if slot else slots.default_slot_name(name)
    publication_name = publication or pub.default_publication_name(name)
    pub.validate_publication_name(publication_name)

    entry = CommentedMap()
    entry["dsn"] = dsn
    if parsed_tables is not None:
        entry["tables"] = config_document.flow_list([str(t) for t in parsed_tables])
    else:
        entry["schemas"] = config_document.flow_list([quote_part(s) for s in parsed_schemas or ()])
    entry["snapshot"] = snapshot
    entry["slot"] = slot_name
    entry["publication"] = publication_name
    config_document.sources_map(document)[name] = entry
    text = config_document.render(document)
    # Validate (and resolve ${VAR} in the DSN) before the database is touched.
    source_config = config_document.validate(text, config_path).sources[name]
    request = _request(name, source_config)

    warnings: list[str] = []
    literal = _literal_password_warning(dsn)
    if literal:
        warnings.append(literal)
    real_dsn = source_config.dsn.get_secret_value()
    with connect(real_dsn, source=name) as conn:
        facts, problems = check_source(conn, request)
        blocking = fatal(problems)
        if blocking:
            raise PrerequisiteError(_problems_line(blocking, name), source=name, problems=tuple(blocking))
        warnings += [p.message for p in problems if not p.fatal]
        action: Literal["created", "altered", "reused"]
        if facts.publication is None:
            action = "created"
        elif facts.publication.publishes_exactly(tables=request.tables, schemas=request.schemas):
            action = "reused"
        else:
            action = "altered"
        if confirm is not None and not confirm(plan_text(request, action, safe_dsn(real_dsn))):
            msg = f"cancelled: nothing was created and {config_path} is unchanged"
            raise CancelledError(msg, source=name)
        if action == "created":
            pub.create_publication(conn, publication_name, source=name, tables=request.tables, schemas=request.schemas)
        elif action == "altered":
            pub.set_publication_targets(
                conn, publication_name, source=name, tables=request.tables, schemas=request.schemas
            )
        created_publication = publication_name if action == "created" else None
        try:
            lsn = slots.create_slot(conn, slot_name, source=name)
        except BaseException:
            _undo(conn, None, created_publication)
            raise
        note = slots.no_failover_note(conn, name)
        try:
            config_document.write_atomically(config_path, text)
        except BaseException as exc:
            _undo(conn, slot_name, created_publication)
            if isinstance(exc, OSError):
                msg = (
                    f"cannot write {config_path}: {exc.strerror}; "
                    "the slot and publication were dropped again, fix the file's permissions and retry"
                )
                raise ConfigError(msg, path=str(config_path)) from None
            raise
    return Registration(
        name=name,
        config_path=config_path,
        slot=slot_name,
        publication=publication_name,
        publication_action=action,
        consistent_lsn=lsn,
        warnings=tuple(warnings),
        notes=(note,) if note else (),
    )


def _undo(conn: psycopg.Connection[Any], slot: str | None, publication: str | None) -> None:
    """Best effort: drop what a failed ``add`` created; the original error is the one to report."""
    with contextlib.suppress(CaptureError, psycopg.Error):
        if slot is not None:
            slots.drop_slot(conn, slot)
    with contextlib.suppress(CaptureError, psycopg.Error):
        if publication is not None:
            pub.drop_publication(conn, publication)


def _configured(config_path: Path, name: str) -> tuple[CommentedMap, SourceConfig]:
    document = config_document.read_document(config_path)
    config = config_document.validate(config_document.render(document), config_path)
    if name not in config.sources:
        known = ", ".join(sorted(config.sources)) or "none"
        msg = f"no source named {name} in {config_path} (registered: {known}); see 'headwater source list'"
        raise UnknownSourceError(msg, source=name)
    return document, config.sources[name]


def removal_text(config: ProjectConfig, name: str) -> str:
    """The confirmation question for ``remove``."""
    if name not in config.sources:
        msg = f"no source named {name} in {config.config_path}; see 'headwater source list'"
        raise UnknownSourceError(msg, source=name)
    source = config.sources[name]
    slot, publication = object_names(name, source)
    return (
        f"drop replication slot {slot} and publication {publication} on {safe_dsn(source.dsn.get_secret_value())} "
        f"and remove source {name} from the config? Capture cannot resume from this slot afterwards"
    )


def remove_source(config_path: Path, name: str) -> Removal:
    """Drop the source's slot and (Headwater-created) publication, then remove it from the config file."""
    config_path = Path(config_path)
    document, source = _configured(config_path, name)
    slot, publication = object_names(name, source)
    notes: list[str] = []
    with connect(source.dsn.get_secret_value(), source=name) as conn:
        slot_dropped = slots.drop_slot(conn, slot, source=name)
        if not slot_dropped:
            notes.append(f"replication slot {slot} did not exist")
        info = pub.publication_info(conn, publication)
        publication_dropped = False
        if info is None:
            notes.append(f"publication {publication} did not exist")
        elif info.created_for(name):
            publication_dropped = pub.drop_publication(conn, publication, source=name)
        else:
            notes.append(
                f"publication {publication} was not created by Headwater, so it was left in place; "
                f"if nothing else uses it, its owner ({info.owner}) can run: DROP PUBLICATION "
                f"{pub.as_text(sql.Identifier(publication))}"
            )
    sources = document["sources"]
    trailing = config_document.detach_trailing_comment(sources[name]) if list(sources.keys())[-1] == name else None
    del sources[name]
    if trailing is not None and not config_document.attach_trailing_comment(sources, trailing):
        sources.fa.set_flow_style()  # `sources: {}`, as `headwater init` writes it
        document.ca.items.setdefault("sources", [None, None, None, None])[2] = CommentToken(
            "\n" + trailing.value, trailing.start_mark, trailing.end_mark
        )
    text = config_document.render(document)
    config_document.validate(text, config_path)
    config_document.write_atomically(config_path, text)
    return Removal(name, slot, publication, slot_dropped, publication_dropped, tuple(notes))


def show_source(config: ProjectConfig, name: str) -> SourceView:
    """The configured source plus its live slot and publication; an unreachable server is reported, not raised."""
    if name not in config.sources:
        known = ", ".join(sorted(config.sources)) or "none"
        msg = f"no source named {name} in {config.config_path} (registered: {known}); see 'headwater source list'"
        raise UnknownSourceError(msg, source=name)
    source = config.sources[name]
    slot, publication = object_names(name, source)
    view = SourceView(
        name=name,
        dsn=safe_dsn(source.dsn.get_secret_value()),
        tables=source.tables,
        schemas=source.schemas,
        snapshot=source.snapshot,
        slot=slot,
        publication=publication,
    )
    try:
        with connect(source.dsn.get_secret_value(), source=name) as conn:
            status = slots.slot_status(conn, slot)
            info = pub.publication_info(conn, publication)
    except CaptureError as exc:
        return replace(view, error=str(exc))
    return replace(view, slot_status=status, publication_info=info)
