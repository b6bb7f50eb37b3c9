"""The Iceberg catalog a warehouse's tables are registered in, and where each table's files live.

An Iceberg table is a chain of metadata files; the catalog holds the pointer to the current
one and moves it with compare-and-swap, so a commit that lost the race to another writer fails
(:class:`pyiceberg.exceptions.CommitFailedException`) instead of overwriting it. The object
store only receives new, uniquely named files: no conditional writes are needed from it.

* **Embedded (default):** a SQL catalog in SQLite, ``<home>/iceberg/catalog.db``: no server,
  any number of processes on one machine (SQLite's own locking serialises the swap).
* **PostgreSQL:** a SQL catalog at ``postgresql://...`` (driven by psycopg 3 through
  SQLAlchemy), for writers and readers on several machines.
* **REST:** any Iceberg REST catalog (Polaris, Lakekeeper, Gravitino, Nessie, ...) by URL;
  its settings are checked when the catalog is opened (:func:`check_rest`).

A table ``orders`` is ``<namespace>.orders``; its files are under ``<warehouse>/orders``, the
same place the Delta table would take, so the warehouse keeps one directory per table and
``storage_options`` serve both formats (:func:`file_io_properties`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from core.config import ProjectConfig
from core.deployment import reveal
from warehouse_loader.errors import WarehouseError
from warehouse_loader.location import TableLocation
from warehouse_loader.object_store import _option, _seconds

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

#: The namespace Headwater's tables are created in unless the catalog settings name another.
DEFAULT_NAMESPACE = "headwater"
#: The catalog's name as pyiceberg records it (SQL catalogs keep it in every row they write).
CATALOG_NAME = "headwater"


class CatalogConfigError(WarehouseError):
    """The Iceberg catalog settings cannot work (a REST catalog without a URL, an unknown kind)."""


@dataclass(frozen=True, slots=True)
class CatalogSpec:
    """Which catalog: ``kind`` ``sql`` (SQLite or PostgreSQL by ``uri``) or ``rest``; extra ``properties``.

    ``properties`` are passed to pyiceberg as they are (a REST catalog's ``credential``,
    ``token``, ``warehouse``, ``scope`` ...); they may hold secrets and are never printed.
    """

    kind: Literal["sql", "rest"]
    #: May hold a password (``postgresql://user:pw@...``): left out of ``repr``, masked by ``str``.
    uri: str = field(repr=False)
    namespace: str = DEFAULT_NAMESPACE
    properties: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __str__(self) -> str:
        """The catalog without credentials: kind and the URI's host and path (never a password)."""
        parts = urlsplit(self.uri)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return f"{self.kind} catalog {parts.scheme}://{host}{port}{parts.path}"


def embedded_catalog(home: Path, namespace: str = DEFAULT_NAMESPACE) -> CatalogSpec:
    """The default catalog: SQLite under ``<home>/iceberg/`` (created on first use)."""
    return CatalogSpec("sql", f"sqlite:///{home / 'iceberg' / 'catalog.db'}", namespace)


def catalog_spec(config: ProjectConfig) -> CatalogSpec:
    """The catalog ``warehouse.iceberg`` of ``config`` names (default: the embedded SQLite one)."""
    settings = config.warehouse.iceberg
    catalog = settings.catalog
    properties = tuple(sorted(reveal(catalog.properties).items()))
    if catalog.uri is None:
        return replace(embedded_catalog(config.home_dir, settings.namespace), properties=properties)
    return CatalogSpec(catalog.type, catalog.uri.get_secret_value(), settings.namespace, properties)


def sql_uri(uri: str) -> str:
    """A PostgreSQL URI as SQLAlchemy takes it with psycopg 3 (the driver Headwater already has)."""
    scheme, sep, rest = uri.partition("://")
    if scheme in ("postgres", "postgresql"):
        return f"postgresql+psycopg{sep}{rest}"
    return uri


def check_rest(spec: CatalogSpec) -> None:
    """Raise :class:`CatalogConfigError` unless ``spec`` is a usable REST catalog's settings."""
    parts = urlsplit(spec.uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        msg = f"iceberg REST catalog: uri must be an http(s):// URL, got {spec.uri!r}"
        raise CatalogConfigError(msg)
    given = dict(spec.properties)
    if "credential" in given and ":" not in given["credential"]:
        msg = "iceberg REST catalog: credential must be '<client id>:<client secret>'"
        raise CatalogConfigError(msg)
    if "credential" in given and "token" in given:
        msg = "iceberg REST catalog: give credential or token, not both"
        raise CatalogConfigError(msg)


def check_sql(spec: CatalogSpec) -> None:
    """Raise :class:`CatalogConfigError` unless ``spec`` names SQLite or PostgreSQL."""
    scheme = spec.uri.partition("://")[0]
    if not (scheme.startswith("sqlite") or scheme.startswith("postgres")):
        msg = f"iceberg SQL catalog: uri must be sqlite:///PATH or postgresql://..., got {scheme}://"
        raise CatalogConfigError(msg)


def file_io_properties(location: TableLocation) -> dict[str, str]:
    """The FileIO settings (pyiceberg's) for the store at ``location``, from the warehouse's ``storage_options``.

    The same keys delta-rs takes (object_store's names) are mapped to pyiceberg's ``s3.*``;
    a local warehouse needs none.
    """
    if not location.is_remote:
        return {}
    options: Mapping[str, str] = location.storage_options or {}
    mapped = {
        "s3.endpoint": _option(options, "aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint"),
        "s3.access-key-id": _option(options, "aws_access_key_id", "access_key_id"),
        "s3.secret-access-key": _option(options, "aws_secret_access_key", "secret_access_key"),
        "s3.session-token": _option(options, "aws_session_token", "session_token", "aws_token", "token"),
        "s3.region": _option(options, "aws_region", "region", "aws_default_region"),
    }
    timeout = _seconds(_option(options, "connect_timeout"))
    if timeout is not None:
        mapped["s3.connect-timeout"] = str(timeout)
    virtual = _option(options, "aws_virtual_hosted_style_request")
    if virtual is not None:
        mapped["s3.force-virtual-addressing"] = virtual
    return {key: value for key, value in mapped.items() if value is not None}


def open_catalog(spec: CatalogSpec, warehouse: TableLocation) -> Catalog:
    """The pyiceberg catalog ``spec`` describes, reading and writing files at ``warehouse``.

    An embedded SQLite catalog's directory is created; the catalog's tables and the namespace are
    created when missing. Processes opening a new catalog at once race on those creations:
    pyiceberg looks, then creates, and the loser's create fails on the database's unique keys
    (``IntegrityError``, seen with two writers) or "already exists"; opening again finds them made.
    """
    for _ in range(_OPEN_ATTEMPTS - 1):
        with contextlib.suppress(*_creation_races(spec)):
            return _open(spec, warehouse)
    return _open(spec, warehouse)


#: A race lost on creating the catalog's tables or namespace is won by the other process: the
#: next open finds them. Three attempts, as at most one creation of each kind can be lost per open.
_OPEN_ATTEMPTS = 3


def _creation_races(spec: CatalogSpec) -> tuple[type[Exception], ...]:
    from pyiceberg.exceptions import NamespaceAlreadyExistsError

    if spec.kind == "rest":
        return (NamespaceAlreadyExistsError,)
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    return (NamespaceAlreadyExistsError, IntegrityError, OperationalError, ProgrammingError)


def _open(spec: CatalogSpec, warehouse: TableLocation) -> Catalog:
    io = file_io_properties(warehouse)
    if spec.kind == "rest":
        check_rest(spec)
        from pyiceberg.catalog.rest import RestCatalog

        catalog: Catalog = RestCatalog(CATALOG_NAME, uri=spec.uri, **io, **dict(spec.properties))
    else:
        check_sql(spec)
        from pyiceberg.catalog.sql import SqlCatalog

        if spec.uri.startswith("sqlite:///"):
            Path(spec.uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
        root = warehouse.uri if warehouse.is_remote else f"file://{warehouse.uri}"
        catalog = SqlCatalog(CATALOG_NAME, uri=sql_uri(spec.uri), warehouse=root, **io, **dict(spec.properties))
    catalog.create_namespace_if_not_exists(spec.namespace)
    return catalog
