"""One Iceberg warehouse table: its catalog, its identifier and where its files go.

A build name (``orders``, or ``orders.v2`` for a reprocessed version) is the table
``<namespace>.orders`` / ``<namespace>.orders__v2`` (Iceberg names cannot hold the namespace
separator ``.``); its files are under ``<warehouse>/<build name>``. The deletes and truncates
an SCD table remembers live in a second table, ``<name>__hw_tombstones``, under
``<table location>/_hw_tombstones`` (the Delta layout's place for them).

Catalogs are opened once per process and settings (:func:`catalog_for`): a SQL catalog
creates an engine and checks its tables when opened.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from warehouse_loader.iceberg.catalog import CatalogSpec, open_catalog
from warehouse_loader.location import TableLocation, storage_error

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

#: The side table's suffix (identifier) and directory (location).
TOMBSTONES_SUFFIX = "__hw_tombstones"
TOMBSTONES_DIR = "_hw_tombstones"

_CATALOGS: dict[tuple[object, ...], Catalog] = {}
_LOCK = threading.Lock()


def catalog_for(spec: CatalogSpec, warehouse: TableLocation) -> Catalog:
    """The process's catalog for ``spec`` whose files go to ``warehouse`` (opened on first use)."""
    key = (spec.kind, spec.uri, spec.namespace, spec.properties, warehouse.uri, warehouse.options)
    with _LOCK:
        if key not in _CATALOGS:
            _CATALOGS[key] = open_catalog(spec, warehouse)
        return _CATALOGS[key]


def table_name(build: str) -> str:
    """The Iceberg table name of a build name (``orders.v2`` -> ``orders__v2``)."""
    return build.replace(".", "__")


@dataclass(frozen=True, slots=True)
class IcebergTableRef:
    """An Iceberg table of the warehouse: ``build`` name in ``catalog``, files under ``warehouse / build``."""

    catalog: CatalogSpec
    warehouse: TableLocation
    build: str
    #: The side table of a table: its identifier and location are derived from the main table's.
    side: bool = False

    def __str__(self) -> str:
        return ".".join(self.identifier)

    @property
    def identifier(self) -> tuple[str, str]:
        """``(namespace, name)`` in the catalog."""
        name = table_name(self.build) + (TOMBSTONES_SUFFIX if self.side else "")
        return (self.catalog.namespace, name)

    @property
    def location(self) -> TableLocation:
        """Where the table's ``data/`` and ``metadata/`` directories are."""
        main = self.warehouse / self.build
        return main / TOMBSTONES_DIR if self.side else main

    @property
    def tombstones(self) -> IcebergTableRef:
        """The table holding this table's remembered deletes and truncates."""
        return IcebergTableRef(self.catalog, self.warehouse, self.build, side=True)

    @property
    def location_uri(self) -> str:
        """The location as Iceberg metadata records it (``file://`` for a local directory)."""
        where = self.location
        return where.uri if where.is_remote else f"file://{where.uri}"

    def open_catalog(self) -> Catalog:
        """The catalog the table is registered in."""
        return catalog_for(self.catalog, self.warehouse)

    def load(self) -> Table | None:
        """The table at its current snapshot, or None when the catalog does not know it (yet)."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.open_catalog().load_table(self.identifier)
        except NoSuchTableError:
            return None
        except OSError as exc:
            raise storage_error(exc, self.location) from None
